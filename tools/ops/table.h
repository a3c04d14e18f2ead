// ops/table.h (internal): a plain-text table with left-aligned, padded columns.
#pragma once

#include <string>
#include <vector>

namespace ckpt::ops::detail {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddHeader(std::string h) { header_.push_back(std::move(h)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns separated by two spaces; trailing spaces trimmed.
  std::string Render() const {
    std::vector<std::size_t> width(header_.size(), 0);
    auto measure = [&](const std::vector<std::string>& r) {
      for (std::size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
    };
    measure(header_);
    for (const auto& r : rows_) measure(r);
    std::string out;
    auto line = [&](const std::vector<std::string>& r) {
      std::string s;
      for (std::size_t i = 0; i < width.size(); ++i) {
        const std::string cell = i < r.size() ? r[i] : "";
        s += cell;
        if (i + 1 < width.size()) s += std::string(width[i] - cell.size() + 2, ' ');
      }
      while (!s.empty() && s.back() == ' ') s.pop_back();
      out += s + "\n";
    };
    line(header_);
    for (const auto& r : rows_) line(r);
    return out;
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace ckpt::ops::detail
