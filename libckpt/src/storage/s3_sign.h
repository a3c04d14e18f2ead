// storage/s3_sign.h: AWS Signature Version 4 for S3 requests, and the hashes it and the S3
// protocol need (SHA-256, HMAC-SHA-256, MD5), over OpenSSL. Pure: no network, no clock
// (the caller passes the time), so a known request signs to AWS's published values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt::storage::s3 {

using Bytes = std::span<const std::byte>;

inline Bytes AsBytes(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

std::string Sha256Hex(Bytes data);
std::string Md5Hex(Bytes data);     // a single-part object's ETag
std::string Md5Base64(Bytes data);  // Content-MD5
// Both forms of one body's MD5, hashed once (a part's Content-MD5 and the ETag it must get).
struct Md5Digest {
  std::string hex, base64;
};
Md5Digest Md5Of(Bytes data);
// The ETag S3 gives a multipart object: the MD5 of the concatenated binary MD5s of its parts,
// then "-<number of parts>". `part_md5_hex` in part order.
std::string MultipartEtag(const std::vector<std::string>& part_md5_hex);

// SigV4's URI encoding: every byte except A-Z a-z 0-9 - _ . ~ becomes %XX (upper-case hex,
// of the UTF-8 bytes); '/' is kept when `keep_slash` (an object key in the path) and encoded
// otherwise (query names and values).
std::string UriEncode(std::string_view s, bool keep_slash);

// An access key and its secret; the secret never leaves this struct except into the HMAC.
struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // sent as x-amz-security-token when not empty
};

// One request to sign. `path` is the canonical URI, already encoded (UriEncode with
// keep_slash); `query` holds the raw (decoded) names and values; `headers` the headers to
// sign, names in any case (host, x-amz-date and x-amz-content-sha256 must be among them).
struct SignRequest {
  std::string method;
  std::string path;
  std::vector<std::pair<std::string, std::string>> query;
  std::map<std::string, std::string> headers;
  std::string payload_sha256;  // hex, or "UNSIGNED-PAYLOAD"
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;      // hex
  std::string authorization;  // the Authorization header's value
};

// Signs `req` for `region` and `service` at `amz_date` ("YYYYMMDDTHHMMSSZ", as in x-amz-date).
Signature SignV4(const SignRequest& req, const Credentials& creds, std::string_view region,
                 std::string_view service, std::string_view amz_date);

// The canonical query string of `query` (sorted by encoded name, then value).
std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query);

// "YYYYMMDDTHHMMSSZ" for a time in seconds since the epoch (UTC).
std::string AmzDate(int64_t unix_seconds);

}  // namespace ckpt::storage::s3
