// format/json_value.cc
#include "format/json_value.h"

#include <unordered_set>


namespace ckpt::format {
namespace {

// Routes nlohmann's SAX events: descended containers keep their keys (to refuse a
// duplicate) and the path; the others are built as trees, as nlohmann's own DOM parser
// builds them, and handed over when they end.
class Router final : public nlohmann::json_sax<Json> {
 public:
  Router(int max_depth, JsonVisitor& visitor) : max_depth_(max_depth), visitor_(visitor) {}
  std::optional<JsonProblem> problem;

  bool null() override { return Put(nullptr); }
  bool boolean(bool v) override { return Put(v); }
  bool number_integer(number_integer_t v) override { return Put(v); }
  bool number_unsigned(number_unsigned_t v) override { return Put(v); }
  bool number_float(number_float_t v, const string_t&) override { return Put(v); }
  bool string(string_t& v) override { return Put(std::move(v)); }
  bool binary(binary_t&) override { return Fail(true, "binary values are not JSON"); }
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    if (!tree_.empty()) {
      // try_emplace leaves `k` as it is when the key is there already.
      auto [it, inserted] = tree_.back()->get_ref<Json::object_t&>().try_emplace(std::move(k), nullptr);
      if (!inserted) return Fail(false, "duplicate key '" + k + "'");
      slot_ = &it->second;
      return true;
    }
    if (!keys_.back().insert(k).second) return Fail(false, "duplicate key '" + k + "'");
    path_.back() = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return Fail(true, e.what());
  }

 private:
  bool Fail(bool syntax, std::string what) {
    if (!problem) problem = JsonProblem{syntax, std::move(what)};
    return false;
  }

  // Where the next value of the tree being built goes.
  Json* Slot() {
    Json& parent = *tree_.back();
    return parent.is_array() ? &parent.get_ref<Json::array_t&>().emplace_back() : slot_;
  }

  // A scalar: built in its place in the tree (no temporary to destroy), or handed over.
  template <class T>
  bool Put(T&& v) {
    if (tree_.empty()) {
      visitor_.Value(path_, Json(std::forward<T>(v)));
    } else if (tree_.back()->is_array()) {
      tree_.back()->get_ref<Json::array_t&>().emplace_back(std::forward<T>(v));
    } else {
      *slot_ = std::forward<T>(v);
    }
    return true;
  }

  bool Open(bool object) {
    if (++depth_ > max_depth_) return Fail(false, "JSON nesting deeper than " + std::to_string(max_depth_));
    const Json::value_t type = object ? Json::value_t::object : Json::value_t::array;
    if (!tree_.empty()) {
      Json* child = Slot();
      *child = Json(type);
      tree_.push_back(child);
    } else if (visitor_.Descend(path_, object)) {
      keys_.emplace_back();
      path_.emplace_back();
    } else {
      root_ = Json(type);
      tree_.push_back(&root_);
    }
    return true;
  }

  bool Close() {
    --depth_;
    if (!tree_.empty()) {
      tree_.pop_back();
      if (tree_.empty()) visitor_.Value(path_, std::move(root_));
      return true;
    }
    keys_.pop_back();
    path_.pop_back();
    return true;
  }

  int max_depth_;
  JsonVisitor& visitor_;
  int depth_ = 0;
  JsonPath path_;                                      // of the next value at a descended level
  std::vector<std::unordered_set<std::string>> keys_;  // of each descended container
  Json root_;                                          // the tree being built
  std::vector<Json*> tree_;                            // its open containers
  Json* slot_ = nullptr;                               // its member whose value comes next
};

}  // namespace

std::optional<JsonProblem> ReadJson(std::string_view text, int max_depth, JsonVisitor& visitor) {
  Router router(max_depth, visitor);
  Json::sax_parse(text.begin(), text.end(), &router);
  return std::move(router.problem);
}

}  // namespace ckpt::format
