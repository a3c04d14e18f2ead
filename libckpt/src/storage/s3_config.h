// storage/s3_config.h: where an S3 client finds its endpoint, region and credentials, the
// AWS way (environment, ~/.aws/credentials, ~/.aws/config), with explicit options on top;
// and the s3://bucket/prefix URL.
//
// Precedence, per setting: the S3Options field if set; else the environment; else the
// profile (AWS_PROFILE or S3Options::profile, "default" otherwise) in the credentials file
// (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials) and the config file (AWS_CONFIG_FILE,
// ~/.aws/config, sections "[profile NAME]" and "[default]"):
//   access key      AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (as a set:
//                   the secret and token are taken from where the key id came from)
//   region          AWS_REGION, AWS_DEFAULT_REGION, profile `region`; else us-east-1
//   endpoint        AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, profile `s3 = endpoint_url` or
//                   `endpoint_url`; else https://s3.<region>.amazonaws.com
//   addressing      profile `s3 = addressing_style` (path, virtual, auto); auto means
//                   virtual-hosted on AWS's own endpoint, path-style on any other
//   CA bundle       AWS_CA_BUNDLE, profile `ca_bundle`: the PEM file of the certificates an
//                   https endpoint is checked against (else libcurl's built-in default);
//                   one that cannot be read is an error naming it, for an https endpoint
// Errors name the file and the line or the variable, never a value read from them (a line of
// a credentials file may hold a secret).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "storage/s3_sign.h"

namespace ckpt::storage::s3 {

enum class Addressing { kAuto, kPath, kVirtual };

// What a caller sets; empty / unset fields come from the environment and the profile.
struct S3Options {
  std::string endpoint;  // "http://127.0.0.1:7480", "https://s3.eu-west-1.amazonaws.com"
  std::string region;
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::string profile;
  Addressing addressing = Addressing::kAuto;
  std::string ca_bundle;  // PEM file of trusted CA certificates (AWS_CA_BUNDLE)
  // Transfers: connections kept for parallel requests (0: none kept, a new connection per
  // request); attempts of an idempotent request
  // (1 = no retry); the first backoff (doubled per retry, full jitter, capped at
  // max_backoff_ms); connect timeout; a transfer slower than 1 KiB/s for this long is a
  // timeout (retried), and so is one whose average speed since its start is below
  // min_average_bytes_per_second once it has run that long: a server that trickles an
  // endless body holds a request for at most max(stall_timeout_s, the request's cap on bytes
  // / min_average_bytes_per_second) per attempt, not for as long as it keeps sending.
  int max_connections = 16;
  int max_attempts = 8;
  int base_backoff_ms = 50;
  int max_backoff_ms = 5000;
  int connect_timeout_ms = 5000;
  int stall_timeout_s = 30;
  int64_t min_average_bytes_per_second = 64 << 10;
};

// The resolved configuration a client runs with.
struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing slash
  std::string region;
  Credentials credentials;
  bool path_style = true;
  // The CA bundle of an https endpoint (empty: libcurl's default), and where it was set.
  std::string ca_bundle;
  std::string ca_bundle_source;
  // Where the credentials came from ("options", "environment", "<file> [profile]"), for
  // messages; never the credentials themselves.
  std::string credentials_source;
  S3Options transfer;  // the transfer settings above (its other fields unused)
};

// Reads an environment variable (nullptr when unset); tests pass their own.
using EnvLookup = std::function<const char*(const char*)>;

// Resolves `opts` against the environment and the profile files; kInvalidArgument naming the
// variable or the file and line for a malformed or half-set configuration, kNotFound when no
// credentials are found anywhere (naming where it looked).
S3Config ResolveS3Config(const S3Options& opts, const EnvLookup& env = {});

// s3://bucket/prefix: the bucket and the key prefix (no leading '/', trailing '/' kept as
// given). kInvalidArgument naming the URL when it is not s3://, has no bucket, or the bucket
// name is not valid for S3 (3-63 of a-z 0-9 . -, starting and ending with a letter or digit).
struct S3Url {
  std::string bucket;
  std::string prefix;
};
bool IsS3Url(std::string_view path);
S3Url ParseS3Url(std::string_view url);

}  // namespace ckpt::storage::s3
