// storage/s3_store.h: the ObjectStore of an S3-compatible server, over HTTP(S) with libcurl,
// requests signed with SigV4 (storage/s3_sign.h), configured the AWS way
// (storage/s3_config.h).
//
// Connections are kept alive: each request takes a curl handle from a pool (up to
// S3Options::max_connections are kept) and gives it back, so that sequential and parallel
// requests reuse their TCP connections. A request that fails with a timeout, a dropped
// connection, a 5xx, 503 SlowDown, 429 or 400 RequestTimeout is sent again after an
// exponential backoff with full jitter, up to max_attempts; then it is kIO naming the bucket,
// the key, the status and the server's error code. Every PUT carries a signed Content-MD5
// of its body (checked by the server), so a body damaged on the way is refused, not stored;
// such a body is signed as UNSIGNED-PAYLOAD (the MD5 covers it: no second hash by SHA-256).
// Other requests sign the SHA-256 of their (empty or small) body.
//
// Retried conditional writes stay exact: when a PutIfAbsent / PutIfMatch answered 412 only
// after an earlier attempt may have reached the server, the object is HEADed and counts as
// ours if its ETag is the MD5 of our body; a CompleteMultipart answered NoSuchUpload after
// a retry counts as done if the object's ETag is the one the parts make.
//
// Server quirks handled (Ceph radosgw 16): If-Match is sent with the ETag unquoted (radosgw
// compares it so; AWS accepts it); CompleteMultipart may answer an empty ETag (returned as
// is: Head gives the real one).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/object_store.h"
#include "storage/s3_config.h"

namespace ckpt::storage {

class S3Store : public ObjectStore {
 public:
  explicit S3Store(s3::S3Config config);
  // Resolves `options` against the environment and the AWS profile files.
  explicit S3Store(const s3::S3Options& options = {});
  ~S3Store() override;
  S3Store(const S3Store&) = delete;
  S3Store& operator=(const S3Store&) = delete;

  const s3::S3Config& config() const { return config_; }

  void CreateBucket(const std::string& bucket) override;
  void DeleteBucket(const std::string& bucket) override;
  std::string Put(const std::string& bucket, const std::string& key, ByteSpan body) override;
  std::optional<std::string> PutIfAbsent(const std::string& bucket, const std::string& key, ByteSpan body) override;
  std::optional<std::string> PutIfMatch(const std::string& bucket, const std::string& key, ByteSpan body,
                                        const std::string& etag) override;
  std::string CreateMultipart(const std::string& bucket, const std::string& key) override;
  std::string UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                         int part_number, ByteSpan body) override;
  std::string CompleteMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                const std::vector<CompletedPart>& parts) override;
  void AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id) override;
  std::vector<MultipartUploadInfo> ListMultipartUploads(const std::string& bucket, const std::string& prefix) override;
  void GetRange(const std::string& bucket, const std::string& key, uint64_t offset, std::span<std::byte> out) override;
  std::vector<std::byte> Get(const std::string& bucket, const std::string& key, uint64_t max_bytes) override;
  std::optional<ObjectInfo> Head(const std::string& bucket, const std::string& key) override;
  ListPage List(const std::string& bucket, const std::string& prefix, const std::string& token,
                int max_keys = 1000) override;
  void DeleteBatch(const std::string& bucket, const std::vector<std::string>& keys) override;

  // Counters since construction: requests sent (attempts, retries included), retries, and
  // TCP connections opened (less than requests when connections are reused).
  struct Stats {
    uint64_t requests = 0;
    uint64_t retries = 0;
    uint64_t connections = 0;
  };
  Stats stats() const;

  struct Request;
  struct Response;

 private:
  Response Send(Request& req);
  Response SendOnce(void* curl, Request& req, std::string& transport_error);
  std::string PutWith(const std::string& bucket, const std::string& key, ByteSpan body,
                      const std::string& condition_header, bool* precondition_failed);
  void* Acquire();
  void Release(void* curl);

  s3::S3Config config_;
  std::mutex pool_mu_;
  std::vector<void*> pool_;
  std::atomic<uint64_t> requests_{0}, retries_{0}, connections_{0};
};

}  // namespace ckpt::storage
