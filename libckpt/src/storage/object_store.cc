#include "storage/object_store.h"

#include <cstdio>
#include <random>

#include "storage/s3_sign.h"

namespace ckpt::storage {
namespace {

std::string RandomName() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

std::vector<ObjectInfo> ListAll(ObjectStore& store, const std::string& bucket, const std::string& prefix) {
  std::vector<ObjectInfo> out;
  std::string token;
  do {
    ListPage page = store.List(bucket, prefix, token);
    for (auto& o : page.objects) out.push_back(std::move(o));
    token = std::move(page.next_token);
  } while (!token.empty());
  return out;
}

ConditionalPutProbe ProbeConditionalPut(ObjectStore& store, const std::string& bucket,
                                        const std::string& probe_prefix) {
  const std::string key = probe_prefix + RandomName();
  const std::string first = "ckpt conditional-put probe, first writer\n";
  const std::string second = "ckpt conditional-put probe, second writer\n";
  ConditionalPutProbe probe;
  struct Cleanup {
    ObjectStore& store;
    const std::string& bucket;
    const std::string& key;
    ~Cleanup() {
      try {
        store.DeleteBatch(bucket, {key});
      } catch (const std::exception&) {  // a leftover probe object is harmless
      }
    }
  } cleanup{store, bucket, key};
  const auto etag = store.PutIfAbsent(bucket, key, s3::AsBytes(first));
  if (!etag) {
    probe.detail = "If-None-Match: * on a fresh key was refused (412)";
    return probe;
  }
  if (store.PutIfAbsent(bucket, key, s3::AsBytes(second))) {
    probe.detail = "If-None-Match: * on an existing key was not refused: the object was overwritten";
    return probe;
  }
  const std::string wrong = s3::Md5Hex(s3::AsBytes(second));
  if (store.PutIfMatch(bucket, key, s3::AsBytes(second), wrong)) {
    probe.detail = "If-Match with a stale ETag was not refused: the object was overwritten";
    return probe;
  }
  if (!store.PutIfMatch(bucket, key, s3::AsBytes(second), *etag)) {
    probe.detail = "If-Match with the current ETag was refused (412)";
    return probe;
  }
  probe.honoured = true;
  return probe;
}

}  // namespace ckpt::storage
