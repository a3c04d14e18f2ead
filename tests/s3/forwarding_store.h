// An ObjectStore that forwards every call to another one: tests derive from it and override
// only the calls they watch or change (counting bytes, hooks before a PUT, a store that
// ignores conditions).
#pragma once

#include <memory>
#include <utility>

#include "storage/object_store.h"

namespace s3_test {

namespace st = ckpt::storage;

class ForwardingStore : public st::ObjectStore {
 public:
  explicit ForwardingStore(std::shared_ptr<st::ObjectStore> inner) : in_(std::move(inner)) {}

  void CreateBucket(const std::string& b) override { in_->CreateBucket(b); }
  void DeleteBucket(const std::string& b) override { in_->DeleteBucket(b); }
  std::string Put(const std::string& b, const std::string& k, st::ByteSpan body) override {
    return in_->Put(b, k, body);
  }
  std::optional<std::string> PutIfAbsent(const std::string& b, const std::string& k, st::ByteSpan body) override {
    return in_->PutIfAbsent(b, k, body);
  }
  std::optional<std::string> PutIfMatch(const std::string& b, const std::string& k, st::ByteSpan body,
                                        const std::string& etag) override {
    return in_->PutIfMatch(b, k, body, etag);
  }
  std::string CreateMultipart(const std::string& b, const std::string& k) override {
    return in_->CreateMultipart(b, k);
  }
  std::string UploadPart(const std::string& b, const std::string& k, const std::string& id, int n,
                         st::ByteSpan body) override {
    return in_->UploadPart(b, k, id, n, body);
  }
  std::string CompleteMultipart(const std::string& b, const std::string& k, const std::string& id,
                                const std::vector<st::CompletedPart>& parts) override {
    return in_->CompleteMultipart(b, k, id, parts);
  }
  void AbortMultipart(const std::string& b, const std::string& k, const std::string& id) override {
    in_->AbortMultipart(b, k, id);
  }
  std::vector<st::MultipartUploadInfo> ListMultipartUploads(const std::string& b, const std::string& p) override {
    return in_->ListMultipartUploads(b, p);
  }
  void GetRange(const std::string& b, const std::string& k, uint64_t offset, std::span<std::byte> out) override {
    in_->GetRange(b, k, offset, out);
  }
  std::vector<std::byte> Get(const std::string& b, const std::string& k, uint64_t max_bytes) override {
    return in_->Get(b, k, max_bytes);
  }
  std::optional<st::ObjectInfo> Head(const std::string& b, const std::string& k) override { return in_->Head(b, k); }
  st::ListPage List(const std::string& b, const std::string& p, const std::string& t, int max_keys) override {
    return in_->List(b, p, t, max_keys);
  }
  void DeleteBatch(const std::string& b, const std::vector<std::string>& keys) override { in_->DeleteBatch(b, keys); }

 protected:
  st::ObjectStore& inner() { return *in_; }

 private:
  std::shared_ptr<st::ObjectStore> in_;
};

}  // namespace s3_test
