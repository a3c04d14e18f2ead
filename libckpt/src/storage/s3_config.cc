#include "storage/s3_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ckpt/error.h"

namespace ckpt::storage::s3 {
namespace {

using Section = std::map<std::string, std::string>;  // key -> value; sub-keys as "s3.key"
using IniFile = std::map<std::string, Section>;      // section name as written in [ ]

std::string Trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// The AWS CLI's INI dialect: "[section]", "key = value", '#' and ';' comments, and nested
// settings ("s3 =" followed by indented "key = value" lines). nullopt when the file does not
// exist; kInvalidArgument naming the file and line (never the line's text) when malformed.
std::optional<IniFile> ReadIni(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  IniFile ini;
  std::string section, nested, line;
  bool in_section = false;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    const auto bad = [&](const std::string& what) {
      return Error(ErrorCode::kInvalidArgument, path + ":" + std::to_string(lineno) + ": " + what);
    };
    if (t.front() == '[') {
      if (t.back() != ']') throw bad("a section header needs a closing ']'");
      section = Trim(std::string_view(t).substr(1, t.size() - 2));
      in_section = true;
      nested.clear();
      ini[section];
      continue;
    }
    const auto eq = t.find('=');
    if (eq == std::string::npos) throw bad("expected 'name = value'");
    if (!in_section) throw bad("a setting before any [section]");
    const bool indented = line[0] == ' ' || line[0] == '\t';
    const std::string key = Trim(std::string_view(t).substr(0, eq));
    const std::string value = Trim(std::string_view(t).substr(eq + 1));
    if (key.empty()) throw bad("a setting without a name");
    if (indented && !nested.empty()) {
      ini[section][nested + "." + key] = value;
    } else if (value.empty()) {
      nested = key;  // "s3 =": the indented lines below belong to it
    } else {
      nested.clear();
      ini[section][key] = value;
    }
  }
  return ini;
}

const std::string* Find(const std::optional<IniFile>& ini, const std::string& section, const std::string& key) {
  if (!ini) return nullptr;
  const auto s = ini->find(section);
  if (s == ini->end()) return nullptr;
  const auto k = s->second.find(key);
  return k == s->second.end() || k->second.empty() ? nullptr : &k->second;
}

bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  }
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  return alnum(b.front()) && alnum(b.back()) && b.find("..") == std::string_view::npos;
}

// The environment, a variable at a time ("" where unset).
class Env {
 public:
  explicit Env(const EnvLookup& lookup)
      : lookup_(lookup ? lookup : EnvLookup([](const char* n) { return std::getenv(n); })) {}
  std::string operator()(const char* name) const {
    const char* v = lookup_(name);
    return v ? std::string(v) : std::string();
  }

 private:
  EnvLookup lookup_;
};

// The AWS profile in use, from ~/.aws/credentials and ~/.aws/config (or the files
// AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE name): its settings and where each is.
struct Profile {
  std::string name;  // "default" unless one is named
  std::string cred_path, conf_path;
  std::optional<IniFile> cred_file, conf_file;
  std::string conf_section;  // "profile NAME" in the config file, or NAME (either form for "default")

  // The setting `key`, the credentials file first; "" where neither has it.
  std::string Value(const std::string& key) const {
    if (const std::string* v = Find(cred_file, name, key)) return *v;
    if (const std::string* v = Find(conf_file, conf_section, key)) return *v;
    return "";
  }
  // Where `key` is (for errors): "FILE [SECTION]".
  std::string Source(const std::string& key) const {
    if (Find(cred_file, name, key)) return cred_path + " [" + name + "]";
    return conf_path + " [" + conf_section + "]";
  }
};

// The profile the options or AWS_PROFILE name (else "default"), its files read. A profile
// named but in neither file is kNotFound.
Profile ReadProfile(const S3Options& opts, const Env& var) {
  Profile p;
  const std::string home = var("HOME");
  p.cred_path = var("AWS_SHARED_CREDENTIALS_FILE");
  if (p.cred_path.empty() && !home.empty()) p.cred_path = home + "/.aws/credentials";
  p.conf_path = var("AWS_CONFIG_FILE");
  if (p.conf_path.empty() && !home.empty()) p.conf_path = home + "/.aws/config";
  p.name = opts.profile;
  if (p.name.empty()) p.name = var("AWS_PROFILE");
  const bool named = !p.name.empty();
  if (p.name.empty()) p.name = "default";
  if (!p.cred_path.empty()) p.cred_file = ReadIni(p.cred_path);
  if (!p.conf_path.empty()) p.conf_file = ReadIni(p.conf_path);
  // The config file names a profile "[profile NAME]", except "default" (either form).
  p.conf_section = p.conf_file && p.conf_file->count("profile " + p.name) ? "profile " + p.name : p.name;
  if (named && !(p.cred_file && p.cred_file->count(p.name)) && !(p.conf_file && p.conf_file->count(p.conf_section))) {
    throw Error(ErrorCode::kNotFound, "AWS profile '" + p.name + "' is in neither " +
                                          (p.cred_path.empty() ? "(no credentials file)" : p.cred_path) + " nor " +
                                          (p.conf_path.empty() ? "(no config file)" : p.conf_path));
  }
  return p;
}

// Credentials as a set, from the first place that has an access key id: the options, the
// environment, the profile. Sets c.credentials and c.credentials_source.
void ResolveCredentials(const S3Options& opts, const Env& var, const Profile& profile, S3Config& c) {
  if (!opts.access_key_id.empty() || !opts.secret_access_key.empty()) {
    if (opts.access_key_id.empty() || opts.secret_access_key.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "S3 options: access_key_id and secret_access_key must be set together");
    }
    c.credentials = {opts.access_key_id, opts.secret_access_key, opts.session_token};
    c.credentials_source = "options";
  } else if (!var("AWS_ACCESS_KEY_ID").empty() || !var("AWS_SECRET_ACCESS_KEY").empty()) {
    if (var("AWS_ACCESS_KEY_ID").empty()) {
      throw Error(ErrorCode::kInvalidArgument, "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not");
    }
    if (var("AWS_SECRET_ACCESS_KEY").empty()) {
      throw Error(ErrorCode::kInvalidArgument, "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
    }
    c.credentials = {var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"), var("AWS_SESSION_TOKEN")};
    c.credentials_source = "environment";
  } else if (!profile.Value("aws_access_key_id").empty()) {
    const std::string source = profile.Source("aws_access_key_id");
    c.credentials = {profile.Value("aws_access_key_id"), profile.Value("aws_secret_access_key"),
                     profile.Value("aws_session_token")};
    if (c.credentials.secret_access_key.empty()) {
      throw Error(ErrorCode::kInvalidArgument, source + ": aws_access_key_id without aws_secret_access_key");
    }
    c.credentials_source = source;
  } else {
    throw Error(ErrorCode::kNotFound,
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile '" + profile.name +
                    "' in " + (profile.cred_path.empty() ? "~/.aws/credentials (HOME is not set)" : profile.cred_path));
  }
}

std::string ResolveRegion(const S3Options& opts, const Env& var, const Profile& profile) {
  std::string region = opts.region;
  if (region.empty()) region = var("AWS_REGION");
  if (region.empty()) region = var("AWS_DEFAULT_REGION");
  if (region.empty()) region = profile.Value("region");
  if (region.empty()) region = "us-east-1";
  return region;
}

// The endpoint, http(s)://host[:port] without a trailing '/': from the options, the
// environment, the profile, else AWS's of `region` (then `aws` is true).
std::string ResolveEndpoint(const S3Options& opts, const Env& var, const Profile& profile, const std::string& region,
                            bool& aws) {
  std::string endpoint = opts.endpoint;
  std::string endpoint_source = "S3 options";
  for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    if (endpoint.empty() && !var(name).empty()) {
      endpoint = var(name);
      endpoint_source = name;
    }
  }
  for (const char* key : {"s3.endpoint_url", "endpoint_url"}) {
    if (endpoint.empty() && !profile.Value(key).empty()) {
      endpoint = profile.Value(key);
      endpoint_source = profile.Source(key) + " " + key;
    }
  }
  aws = endpoint.empty();
  if (aws) endpoint = "https://s3." + region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const auto scheme = endpoint.find("://");
  if (scheme == std::string::npos || (endpoint.compare(0, scheme, "http") != 0 && endpoint.compare(0, scheme, "https") != 0) ||
      endpoint.size() == scheme + 3 || endpoint.find('/', scheme + 3) != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                endpoint_source + ": endpoint '" + endpoint + "' is not http(s)://host[:port]");
  }
  return endpoint;
}

// The options' addressing; where they leave it kAuto, the profile's s3 addressing_style.
Addressing ResolveAddressing(const S3Options& opts, const Profile& profile) {
  if (opts.addressing != Addressing::kAuto) return opts.addressing;
  const std::string style = profile.Value("s3.addressing_style");
  if (style == "path") return Addressing::kPath;
  if (style == "virtual") return Addressing::kVirtual;
  if (!style.empty() && style != "auto") {
    throw Error(ErrorCode::kInvalidArgument, profile.Source("s3.addressing_style") +
                                                 ": s3 addressing_style must be path, virtual or auto, not '" + style +
                                                 "'");
  }
  return Addressing::kAuto;
}

// The CA bundle from the options, AWS_CA_BUNDLE or the profile, and where it came from.
// Only an https endpoint reads it (botocore ignores it for http): checked here, so that a
// wrong path is this error, not a TLS failure at the first request.
void ResolveCaBundle(const S3Options& opts, const Env& var, const Profile& profile, S3Config& c) {
  c.ca_bundle = opts.ca_bundle;
  c.ca_bundle_source = "S3 options ca_bundle";
  if (c.ca_bundle.empty() && !var("AWS_CA_BUNDLE").empty()) {
    c.ca_bundle = var("AWS_CA_BUNDLE");
    c.ca_bundle_source = "AWS_CA_BUNDLE";
  }
  if (c.ca_bundle.empty() && !profile.Value("ca_bundle").empty()) {
    c.ca_bundle = profile.Value("ca_bundle");
    c.ca_bundle_source = profile.Source("ca_bundle") + " ca_bundle";
  }
  if (c.ca_bundle.empty()) c.ca_bundle_source.clear();
  if (!c.ca_bundle.empty() && c.endpoint.compare(0, c.endpoint.find("://"), "https") == 0) {
    std::error_code ec;
    const auto st = std::filesystem::status(c.ca_bundle, ec);
    std::ifstream probe(c.ca_bundle);
    if (ec || !std::filesystem::is_regular_file(st) || !probe) {
      throw Error(ErrorCode::kInvalidArgument,
                  c.ca_bundle_source + ": CA bundle '" + c.ca_bundle + "' for " + c.endpoint + " is not a readable file" +
                      (ec ? " (" + ec.message() + ")" : ""));
    }
  }
}

void CheckTransferOptions(const S3Options& opts) {
  if (opts.max_connections < 0 || opts.max_attempts < 1 || opts.base_backoff_ms < 0 || opts.max_backoff_ms < 0 ||
      opts.connect_timeout_ms < 1 || opts.stall_timeout_s < 1 || opts.min_average_bytes_per_second < 0) {
    throw Error(ErrorCode::kInvalidArgument, "S3 options: attempts and timeouts must be positive, connections not negative");
  }
}

}  // namespace

S3Config ResolveS3Config(const S3Options& opts, const EnvLookup& env) {
  const Env var(env);
  const Profile profile = ReadProfile(opts, var);
  S3Config c;
  c.transfer = opts;
  ResolveCredentials(opts, var, profile, c);
  c.region = ResolveRegion(opts, var, profile);
  bool aws_endpoint = false;
  c.endpoint = ResolveEndpoint(opts, var, profile, c.region, aws_endpoint);
  const Addressing addressing = ResolveAddressing(opts, profile);
  ResolveCaBundle(opts, var, profile, c);
  c.path_style = addressing == Addressing::kAuto ? !aws_endpoint : addressing == Addressing::kPath;
  CheckTransferOptions(opts);
  return c;
}


bool IsS3Url(std::string_view path) { return path.substr(0, 5) == "s3://"; }

S3Url ParseS3Url(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, "'" + std::string(url) + "': " + why);
  };
  if (!IsS3Url(url)) throw bad("not an s3://bucket/prefix URL");
  const std::string_view rest = url.substr(5);
  const auto slash = rest.find('/');
  S3Url u;
  u.bucket = std::string(rest.substr(0, slash));
  if (u.bucket.empty()) throw bad("no bucket");
  if (!ValidBucket(u.bucket)) {
    throw bad("bucket '" + u.bucket + "' is not a valid S3 bucket name (3-63 of a-z 0-9 . -)");
  }
  if (slash != std::string_view::npos) u.prefix = std::string(rest.substr(slash + 1));
  if (u.prefix.find('\0') != std::string::npos) throw bad("a key cannot hold a NUL byte");
  return u;
}

}  // namespace ckpt::storage::s3
