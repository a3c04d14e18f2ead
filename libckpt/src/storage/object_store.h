// storage/object_store.h: the object-store seam, beside the file-system one (storage/fs.h).
// Everything ckpt does on S3-compatible storage goes through an ObjectStore: the real one is
// S3Store (storage/s3_store.h: HTTP with SigV4 over libcurl); tests may put another in
// between to inject faults.
//
// ETags are passed and returned without their quotes. Errors are ckpt::Error naming the
// bucket, the key and, for a server's refusal, the HTTP status and the server's error code:
// kNotFound (404), kAlreadyExists (a 412 the caller did not ask to see), kIO otherwise.
// Implementations must be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ckpt::storage {

using ByteSpan = std::span<const std::byte>;

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;           // unquoted
  std::string last_modified;  // as the server wrote it (ISO 8601 in listings, HTTP date in HEAD)
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  std::string next_token;  // empty: this was the last page
};

struct MultipartUploadInfo {
  std::string key;
  std::string upload_id;
  std::string initiated;  // ISO 8601
};

struct CompletedPart {
  int number = 0;    // 1..10000
  std::string etag;  // as UploadPart returned it
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  virtual void CreateBucket(const std::string& bucket) = 0;  // an existing bucket of ours is fine
  virtual void DeleteBucket(const std::string& bucket) = 0;  // must be empty

  // PUT, with Content-MD5; returns the new object's ETag.
  virtual std::string Put(const std::string& bucket, const std::string& key, ByteSpan body) = 0;
  // PUT with If-None-Match: * : the ETag, or nullopt when the key exists (412).
  virtual std::optional<std::string> PutIfAbsent(const std::string& bucket, const std::string& key, ByteSpan body) = 0;
  // PUT with If-Match: <etag>: the new ETag, or nullopt when the object is absent or its
  // ETag is another (412).
  virtual std::optional<std::string> PutIfMatch(const std::string& bucket, const std::string& key, ByteSpan body,
                                                const std::string& etag) = 0;

  // Multipart upload: the upload id; each part's ETag (parts but the last >= 5 MiB, each sent
  // with Content-MD5); Complete returns the ETag the server answered, which may be empty
  // (Ceph 16): Head gives the real one.
  virtual std::string CreateMultipart(const std::string& bucket, const std::string& key) = 0;
  virtual std::string UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                 int part_number, ByteSpan body) = 0;
  virtual std::string CompleteMultipart(const std::string& bucket, const std::string& key,
                                        const std::string& upload_id, const std::vector<CompletedPart>& parts) = 0;
  virtual void AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id) = 0;
  // Every unfinished upload under `prefix` (all pages).
  virtual std::vector<MultipartUploadInfo> ListMultipartUploads(const std::string& bucket,
                                                                const std::string& prefix) = 0;

  // Exactly out.size() bytes from `offset`: a shorter or longer answer, or another range, is
  // kIO naming the key (never a partial fill).
  virtual void GetRange(const std::string& bucket, const std::string& key, uint64_t offset,
                        std::span<std::byte> out) = 0;
  // The whole object, refused (kIO) above `max_bytes`.
  virtual std::vector<std::byte> Get(const std::string& bucket, const std::string& key, uint64_t max_bytes) = 0;
  // nullopt when there is no such key.
  virtual std::optional<ObjectInfo> Head(const std::string& bucket, const std::string& key) = 0;
  // One page of ListObjectsV2 under `prefix` (keys in UTF-8 binary order), from `token`.
  virtual ListPage List(const std::string& bucket, const std::string& prefix, const std::string& token,
                        int max_keys = 1000) = 0;
  // DeleteObjects, 1000 keys per request; a key that is not there is not an error. Any key
  // the server failed to delete is kIO naming it.
  virtual void DeleteBatch(const std::string& bucket, const std::vector<std::string>& keys) = 0;
};

// Every object under `prefix`, following continuation tokens.
std::vector<ObjectInfo> ListAll(ObjectStore& store, const std::string& bucket, const std::string& prefix);

// Whether the store honours conditional PUT, as the commit needs: two PutIfAbsent of one
// fresh probe key (`probe_prefix` + a random name) must give one success and one nullopt,
// and a PutIfMatch with a wrong ETag must give nullopt while the right ETag succeeds. The
// probe key is deleted after. False names no error: the caller refuses such a store (or
// goes on single-writer where the user said so); a failing request is thrown.
struct ConditionalPutProbe {
  bool honoured = false;
  std::string detail;  // what was seen when not honoured
};
ConditionalPutProbe ProbeConditionalPut(ObjectStore& store, const std::string& bucket,
                                        const std::string& probe_prefix = ".ckpt-probe/");

}  // namespace ckpt::storage
