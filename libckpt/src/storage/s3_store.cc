#include "storage/s3_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "ckpt/error.h"
#include "storage/s3_sign.h"

namespace ckpt::storage {

namespace {

constexpr uint64_t kMaxXmlBytes = 64ull << 20;    // a listing or a result document
constexpr uint64_t kMaxErrorBytes = 64ull << 10;  // an error document (kept for its Code)
constexpr std::size_t kDeleteBatch = 1000;         // DeleteObjects' limit

std::once_flag g_curl_init;

// ---- the few pieces of XML S3 answers with: flat elements, no CDATA, five entities ----

std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const auto semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    unsigned long cp = 0;
    bool ok = true;
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      const bool hex = ent[1] == 'x' || ent[1] == 'X';
      const std::string digits(ent.substr(hex ? 2 : 1));
      char* end = nullptr;
      cp = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      ok = !digits.empty() && end && *end == '\0' && cp > 0 && cp <= 0x10FFFF;
      if (ok) {  // UTF-8
        if (cp < 0x80) {
          out += static_cast<char>(cp);
        } else if (cp < 0x800) {
          out += static_cast<char>(0xC0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          out += static_cast<char>(0xE0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          out += static_cast<char>(0xF0 | (cp >> 18));
          out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        }
      }
    } else {
      ok = false;
    }
    if (!ok) {
      out += s[i];
      continue;
    }
    i = semi;
  }
  return out;
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\r': out += "&#13;"; break;
      default: out += c;
    }
  }
  return out;
}

// The raw contents of each <tag>...</tag> (or <tag attr...>...</tag>) in `xml`, in order;
// <tag/> gives an empty one.
std::vector<std::string_view> Elements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  std::size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    const std::size_t after = pos + open.size();
    if (after >= xml.size()) break;
    const char c = xml[after];
    if (c != '>' && c != ' ' && c != '/') {
      pos = after;
      continue;
    }
    const auto gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    const auto end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::string Text(std::string_view xml, std::string_view tag) {
  const auto e = Elements(xml, tag);
  return e.empty() ? std::string() : XmlUnescape(e.front());
}

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

uint64_t ParseU64(const std::string& s, const std::string& what) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 19) {
    throw Error(ErrorCode::kIO, what + ": the server answered '" + s + "', not a size");
  }
  return std::stoull(s);
}


}  // namespace

struct S3Store::Request {
  std::string method{};  // GET HEAD PUT POST DELETE
  std::string bucket{};
  std::string key{};  // may be empty (a bucket request)
  std::vector<std::pair<std::string, std::string>> query{};
  std::vector<std::pair<std::string, std::string>> headers{};  // unsigned extra headers
  bool content_md5 = false;  // send (and sign) Content-MD5 of the body
  std::string md5_base64{};  // that Content-MD5 when the caller hashed the body already
  ByteSpan body{};
  std::span<std::byte> out{};  // a ranged GET's destination (exact size)
  bool to_out = false;
  uint64_t max_body = kMaxXmlBytes;
  // Set by Send: whether an earlier attempt of this request may have reached the server.
  bool retried = false;
  std::string Name() const {
    return "s3://" + bucket + (key.empty() ? std::string() : "/" + key);
  }
};

struct S3Store::Response {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  uint64_t written = 0;                         // bytes written into Request::out
  bool overflow = false;                        // the body was longer than allowed
  bool error_cut = false;                       // an error document cut at kMaxErrorBytes
  std::string Header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  std::string ErrorCode() const { return Text(body, "Code"); }
};

namespace {

struct Transfer {
  const S3Store::Request* req;
  S3Store::Response* resp;
  CURL* curl;
  std::size_t read_pos = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double grace_s = 0;         // stall_timeout_s: the average speed is judged after this long
  double min_rate = 0;        // min_average_bytes_per_second (0: not judged)
  double too_slow_rate = -1;  // the average that ended the transfer, if one did
};

// libcurl's progress callback: ends a transfer whose average speed (bytes sent and received
// since its start) has fallen below the minimum once it has run for the grace period.
int JudgeProgress(void* user, curl_off_t, curl_off_t received, curl_off_t, curl_off_t sent) {
  auto* t = static_cast<Transfer*>(user);
  if (t->min_rate <= 0) return 0;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t->start).count();
  if (elapsed < t->grace_s) return 0;
  const double rate = static_cast<double>(received + sent) / elapsed;
  if (rate >= t->min_rate) return 0;
  t->too_slow_rate = rate;
  return 1;  // CURLE_ABORTED_BY_CALLBACK
}

std::size_t ReadBody(char* buf, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const ByteSpan body = t->req->body;
  const std::size_t len = std::min(size * n, body.size() - t->read_pos);
  if (len > 0) std::memcpy(buf, body.data() + t->read_pos, len);
  t->read_pos += len;
  return len;
}

std::size_t WriteBody(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->req->to_out && (status == 200 || status == 206)) {
    if (t->resp->written + len > t->req->out.size()) {
      t->resp->overflow = true;
      return 0;  // aborts the transfer: more than the range asked for
    }
    std::memcpy(t->req->out.data() + t->resp->written, data, len);
    t->resp->written += len;
    return len;
  }
  const uint64_t limit = status >= 300 ? kMaxErrorBytes : t->req->max_body;
  if (t->resp->body.size() + len > limit) {
    if (status >= 300) {  // an error document: its head is enough; an endless one is cut here
      t->resp->body.append(data, static_cast<std::size_t>(limit - t->resp->body.size()));
      t->resp->error_cut = true;
      return 0;  // ends the transfer; the answer is its status
    }
    t->resp->overflow = true;
    return 0;
  }
  t->resp->body.append(data, len);
  return len;
}

std::size_t WriteHeader(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view line(data, size * n);
  if (line.substr(0, 5) == "HTTP/") {
    t->resp->headers.clear();  // a new response (after 100 Continue, or a redirect)
    return size * n;
  }
  const auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string value(line.substr(colon + 1));
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.pop_back();
    const auto b = value.find_first_not_of(' ');
    t->resp->headers[Lower(std::string(line.substr(0, colon)))] = b == std::string::npos ? "" : value.substr(b);
  }
  return size * n;
}

bool RetryableCurl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

bool RetryableStatus(const S3Store::Response& r) {
  if (r.status >= 500 || r.status == 429) return true;
  if (r.status == 400 && r.ErrorCode() == "RequestTimeout") return true;
  return false;
}


// Where a request goes: the Host header, the path as signed, the whole URL (query included).
struct Target {
  std::string host, path, url;
};

Target TargetOf(const s3::S3Config& config, const S3Store::Request& req) {
  const auto scheme_end = config.endpoint.find("://") + 3;
  const std::string scheme = config.endpoint.substr(0, scheme_end);
  Target t;
  t.host = config.endpoint.substr(scheme_end);
  t.path = "/";
  if (!req.bucket.empty()) {
    if (config.path_style) {
      t.path += req.bucket;
      if (!req.key.empty()) t.path += "/" + s3::UriEncode(req.key, true);
    } else {
      t.host = req.bucket + "." + t.host;
      t.path += s3::UriEncode(req.key, true);
    }
  }
  t.url = scheme + t.host + t.path;
  std::string query_string;
  for (const auto& [k, v] : req.query) {
    query_string += query_string.empty() ? "?" : "&";
    query_string += s3::UriEncode(k, false);
    if (!v.empty()) query_string += "=" + s3::UriEncode(v, false);
  }
  t.url += query_string;
  return t;
}

// A request's header lines for curl, freed with it.
class HeaderLines {
 public:
  HeaderLines() = default;
  HeaderLines(const HeaderLines&) = delete;
  HeaderLines& operator=(const HeaderLines&) = delete;
  ~HeaderLines() { curl_slist_free_all(list_); }
  void Add(const std::string& line) {
    curl_slist* n = curl_slist_append(list_, line.c_str());
    if (!n) throw Error(ErrorCode::kInternal, "curl_slist_append failed");
    list_ = n;
  }
  curl_slist* get() const { return list_; }

 private:
  curl_slist* list_ = nullptr;
};

// The headers of `req` to `target`: those SigV4 signs and the Authorization over them,
// then the unsigned ones (no 100-continue, the content type of a POST, the request's extras).
void AddSignedHeaders(const s3::S3Config& config, const S3Store::Request& req, const Target& target,
                      HeaderLines& headers) {
  s3::SignRequest sr;
  sr.method = req.method;
  sr.path = target.path;
  sr.query = req.query;
  const std::string amz_date = s3::AmzDate(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  // A body under a signed Content-MD5 (which the server checks) is sent as UNSIGNED-PAYLOAD,
  // as the AWS SDKs do over HTTPS: hashing every part by SHA-256 as well as by MD5 cost
  // about a third of the client's CPU of a save (bench/s3.sh, docs/benchmarks.md).
  sr.payload_sha256 = req.content_md5 && !req.body.empty() ? "UNSIGNED-PAYLOAD" : s3::Sha256Hex(req.body);
  sr.headers["host"] = target.host;
  sr.headers["x-amz-date"] = amz_date;
  sr.headers["x-amz-content-sha256"] = sr.payload_sha256;
  if (!config.credentials.session_token.empty()) {
    sr.headers["x-amz-security-token"] = config.credentials.session_token;
  }
  if (req.content_md5) sr.headers["content-md5"] = req.md5_base64.empty() ? s3::Md5Base64(req.body) : req.md5_base64;
  const s3::Signature sig = s3::SignV4(sr, config.credentials, config.region, "s3", amz_date);
  for (const auto& [k, v] : sr.headers) headers.Add(k + ": " + v);
  headers.Add("Authorization: " + sig.authorization);
  headers.Add("Expect:");  // no 100-continue round trip
  if (req.method == "POST") headers.Add("Content-Type: application/xml");
  for (const auto& [k, v] : req.headers) headers.Add(k + ": " + v);
}

// The options of one transfer on `curl`: the URL and headers, the connection's timeouts, the
// callbacks into `t`, the CA bundle, and the method of t.req with its body.
void SetTransferOptions(CURL* curl, const s3::S3Config& config, const std::string& url, curl_slist* headers,
                        Transfer& t) {
  const S3Store::Request& req = *t.req;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);  // keys like "a/../b" stay as they are
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config.transfer.connect_timeout_ms));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(config.transfer.stall_timeout_s));
  t.grace_s = config.transfer.stall_timeout_s;
  t.min_rate = static_cast<double>(config.transfer.min_average_bytes_per_second);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, JudgeProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, WriteHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  if (!config.ca_bundle.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, config.ca_bundle.c_str());
  if (req.method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else if (req.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (req.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
}

// What a failed transfer says (curl's text and its error buffer), the CA bundle and where it
// came from where TLS failed; a "!" in front marks an error not to retry.
std::string TransportError(const s3::S3Config& config, CURLcode rc, const char* errbuf) {
  std::string e = std::string(curl_easy_strerror(rc)) + (errbuf[0] ? std::string(" (") + errbuf + ")" : "");
  if (!config.ca_bundle.empty() &&
      (rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CONNECT_ERROR)) {
    e += "; CA bundle '" + config.ca_bundle + "' from " + config.ca_bundle_source;
  }
  return RetryableCurl(rc) ? e : "!" + e;
}

}  // namespace

S3Store::S3Store(s3::S3Config config) : config_(std::move(config)) {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

S3Store::S3Store(const s3::S3Options& options) : S3Store(s3::ResolveS3Config(options)) {}

S3Store::~S3Store() {
  for (void* h : pool_) curl_easy_cleanup(static_cast<CURL*>(h));
}

S3Store::Stats S3Store::stats() const { return {requests_.load(), retries_.load(), connections_.load()}; }

void* S3Store::Acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      void* h = pool_.back();
      pool_.pop_back();
      return h;
    }
  }
  CURL* h = curl_easy_init();
  if (!h) throw Error(ErrorCode::kInternal, "curl_easy_init failed");
  return h;
}

void S3Store::Release(void* h) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (pool_.size() < static_cast<std::size_t>(config_.transfer.max_connections)) {
    pool_.push_back(h);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(h));
  }
}

S3Store::Response S3Store::SendOnce(void* handle, Request& req, std::string& transport_error) {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_reset(curl);  // keeps the connection cache
  const Target target = TargetOf(config_, req);
  HeaderLines headers;
  AddSignedHeaders(config_, req, target, headers);
  Response resp;
  Transfer t{&req, &resp, curl};
  SetTransferOptions(curl, config_, target.url, headers.get(), t);
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);

  ++requests_;
  const CURLcode rc = curl_easy_perform(curl);
  long new_connections = 0;
  if (curl_easy_getinfo(curl, CURLINFO_NUM_CONNECTS, &new_connections) == CURLE_OK && new_connections > 0) {
    connections_ += static_cast<uint64_t>(new_connections);
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
  if (rc != CURLE_OK && !resp.overflow && !(resp.error_cut && rc == CURLE_WRITE_ERROR)) {
    transport_error = TransportError(config_, rc, errbuf);
    if (t.too_slow_rate >= 0) {  // retried, as a timeout is
      transport_error = "the transfer averaged " + std::to_string(static_cast<int64_t>(t.too_slow_rate)) +
                        " B/s after " + std::to_string(config_.transfer.stall_timeout_s) + " s, below the " +
                        std::to_string(config_.transfer.min_average_bytes_per_second) + " B/s required";
    }
    resp.status = 0;
  }
  return resp;
}

S3Store::Response S3Store::Send(Request& req) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const int attempts = config_.transfer.max_attempts;
  req.retried = false;
  for (int attempt = 1;; ++attempt) {
    std::string transport_error;
    void* h = Acquire();
    Response resp;
    try {
      resp = SendOnce(h, req, transport_error);
    } catch (...) {
      Release(h);
      throw;
    }
    Release(h);
    if (resp.overflow) {
      throw Error(ErrorCode::kIO, req.Name() + ": " + req.method + ": the server sent more than " +
                                      std::to_string(req.to_out ? req.out.size() : req.max_body) +
                                      " bytes (the range or the limit asked for)");
    }
    const bool transport = resp.status == 0;
    const bool retry = transport ? transport_error[0] != '!' : RetryableStatus(resp);
    if (!retry || attempt >= attempts) {
      if (transport) {
        throw Error(ErrorCode::kIO, req.Name() + ": " + req.method + " to " + config_.endpoint + " failed" +
                                        (attempt > 1 ? " after " + std::to_string(attempt) + " attempts" : "") +
                                        ": " + transport_error.substr(transport_error[0] == '!' ? 1 : 0));
      }
      if (retry) {
        const std::string code = resp.ErrorCode();
        throw Error(ErrorCode::kIO, req.Name() + ": " + req.method + ": HTTP " + std::to_string(resp.status) +
                                        (code.empty() ? "" : " " + code) + " after " + std::to_string(attempt) +
                                        " attempts");
      }
      return resp;
    }
    req.retried = true;
    ++retries_;
    const int64_t cap = std::min<int64_t>(config_.transfer.max_backoff_ms,
                                          int64_t{config_.transfer.base_backoff_ms} << std::min(attempt - 1, 20));
    const int64_t sleep_ms = cap > 0 ? std::uniform_int_distribution<int64_t>(0, cap)(rng) : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
}

namespace {

// kNotFound / kAlreadyExists / kIO for an answer the caller did not expect.
[[noreturn]] void Fail(const S3Store::Request& req, const S3Store::Response& resp, const std::string& hint = "") {
  const std::string code = resp.ErrorCode();
  const std::string message = Text(resp.body, "Message");
  std::string what = req.Name() + ": " + req.method + ": HTTP " + std::to_string(resp.status);
  if (!code.empty()) what += " " + code;
  if (!message.empty()) what += " (" + message + ")";
  if (!hint.empty()) what += "; " + hint;
  const ErrorCode ec = resp.status == 404 ? ErrorCode::kNotFound
                       : resp.status == 412 ? ErrorCode::kAlreadyExists
                                            : ErrorCode::kIO;
  throw Error(ec, what);
}

bool Ok(const S3Store::Response& r) { return r.status >= 200 && r.status < 300; }

}  // namespace

void S3Store::CreateBucket(const std::string& bucket) {
  Request req{.method = "PUT", .bucket = bucket};
  const Response resp = Send(req);
  if (Ok(resp) || resp.ErrorCode() == "BucketAlreadyOwnedByYou") return;
  Fail(req, resp);
}

void S3Store::DeleteBucket(const std::string& bucket) {
  Request req{.method = "DELETE", .bucket = bucket};
  const Response resp = Send(req);
  if (Ok(resp) || (resp.status == 404 && req.retried)) return;
  Fail(req, resp);
}

std::string S3Store::PutWith(const std::string& bucket, const std::string& key, ByteSpan body,
                             const std::string& condition_header, bool* precondition_failed) {
  const s3::Md5Digest digest = s3::Md5Of(body);
  const std::string& md5 = digest.hex;
  Request req{.method = "PUT", .bucket = bucket, .key = key, .content_md5 = true, .md5_base64 = digest.base64,
              .body = body};
  if (!condition_header.empty()) req.headers.emplace_back(condition_header.substr(0, condition_header.find(':')),
                                                          condition_header.substr(condition_header.find(':') + 2));
  const Response resp = Send(req);
  if (Ok(resp)) {
    const std::string etag = Unquote(resp.Header("etag"));
    if (!etag.empty() && etag != md5) {
      throw Error(ErrorCode::kIO, req.Name() + ": PUT: the server's ETag " + etag + " is not the MD5 of the body sent (" +
                                      md5 + ")");
    }
    return etag.empty() ? md5 : etag;
  }
  if (resp.status == 412 && precondition_failed) {
    if (req.retried) {  // an earlier attempt may have written it: is the object ours?
      const auto info = Head(bucket, key);
      if (info && info->etag == md5) return md5;
    }
    *precondition_failed = true;
    return "";
  }
  Fail(req, resp, resp.status == 403 ? "credentials from " + config_.credentials_source : "");
}

std::string S3Store::Put(const std::string& bucket, const std::string& key, ByteSpan body) {
  return PutWith(bucket, key, body, "", nullptr);
}

std::optional<std::string> S3Store::PutIfAbsent(const std::string& bucket, const std::string& key, ByteSpan body) {
  bool failed = false;
  std::string etag = PutWith(bucket, key, body, "If-None-Match: *", &failed);
  if (failed) return std::nullopt;
  return etag;
}

std::optional<std::string> S3Store::PutIfMatch(const std::string& bucket, const std::string& key, ByteSpan body,
                                               const std::string& etag) {
  if (etag.empty() || etag.find_first_of("\"\r\n") != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument, "s3://" + bucket + "/" + key + ": PutIfMatch needs an unquoted ETag, not '" +
                                                 etag + "'");
  }
  bool failed = false;
  std::string out = PutWith(bucket, key, body, "If-Match: " + etag, &failed);
  if (failed) return std::nullopt;
  return out;
}

std::string S3Store::CreateMultipart(const std::string& bucket, const std::string& key) {
  Request req{.method = "POST", .bucket = bucket, .key = key, .query = {{"uploads", ""}}};
  const Response resp = Send(req);
  if (!Ok(resp)) Fail(req, resp);
  const std::string id = Text(resp.body, "UploadId");
  if (id.empty()) throw Error(ErrorCode::kIO, req.Name() + ": CreateMultipartUpload: no UploadId in the answer");
  return id;
}

std::string S3Store::UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                int part_number, ByteSpan body) {
  if (part_number < 1 || part_number > 10000) {
    throw Error(ErrorCode::kInvalidArgument, "s3://" + bucket + "/" + key + ": part number " +
                                                 std::to_string(part_number) + " is not in 1..10000");
  }
  const s3::Md5Digest digest = s3::Md5Of(body);
  Request req{.method = "PUT", .bucket = bucket, .key = key,
              .query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}},
              .content_md5 = true, .md5_base64 = digest.base64, .body = body};
  const Response resp = Send(req);
  if (!Ok(resp)) Fail(req, resp, "part " + std::to_string(part_number));
  const std::string etag = Unquote(resp.Header("etag"));
  const std::string& md5 = digest.hex;
  if (!etag.empty() && etag != md5) {
    throw Error(ErrorCode::kIO, req.Name() + ": part " + std::to_string(part_number) + ": the server's ETag " + etag +
                                    " is not the MD5 of the part sent (" + md5 + ")");
  }
  return etag.empty() ? md5 : etag;
}

std::string S3Store::CompleteMultipart(const std::string& bucket, const std::string& key,
                                       const std::string& upload_id, const std::vector<CompletedPart>& parts) {
  std::string xml = "<CompleteMultipartUpload>";
  std::vector<std::string> md5s;
  for (const CompletedPart& p : parts) {
    xml += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>\"" + XmlEscape(p.etag) +
           "\"</ETag></Part>";
    md5s.push_back(p.etag);
  }
  xml += "</CompleteMultipartUpload>";
  Request req{.method = "POST", .bucket = bucket, .key = key, .query = {{"uploadId", upload_id}},
              .content_md5 = true, .body = s3::AsBytes(xml)};
  const Response resp = Send(req);
  // A 200 may still carry an <Error> (AWS: the failure came after the answer began).
  if (Ok(resp) && Elements(resp.body, "Error").empty()) return Unquote(Text(resp.body, "ETag"));
  if (resp.status == 404 && resp.ErrorCode() == "NoSuchUpload" && req.retried) {
    // An earlier attempt completed it; the object must then be the one these parts make.
    const auto info = Head(bucket, key);
    bool all_md5 = true;
    for (const auto& m : md5s) all_md5 = all_md5 && m.size() == 32;
    if (info && all_md5 && info->etag == s3::MultipartEtag(md5s)) return info->etag;
  }
  if (Ok(resp)) {
    throw Error(ErrorCode::kIO, req.Name() + ": CompleteMultipartUpload: HTTP 200 with error " +
                                    Text(resp.body, "Code") + " (" + Text(resp.body, "Message") + ")");
  }
  Fail(req, resp, "upload " + upload_id);
}

void S3Store::AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id) {
  Request req{.method = "DELETE", .bucket = bucket, .key = key, .query = {{"uploadId", upload_id}}};
  const Response resp = Send(req);
  if (Ok(resp) || (resp.status == 404 && req.retried)) return;
  Fail(req, resp, "upload " + upload_id);
}

std::vector<MultipartUploadInfo> S3Store::ListMultipartUploads(const std::string& bucket, const std::string& prefix) {
  std::vector<MultipartUploadInfo> out;
  std::string key_marker, id_marker;
  for (;;) {
    Request req{.method = "GET", .bucket = bucket, .query = {{"uploads", ""}}};
    if (!prefix.empty()) req.query.emplace_back("prefix", prefix);
    if (!key_marker.empty()) req.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) req.query.emplace_back("upload-id-marker", id_marker);
    const Response resp = Send(req);
    if (!Ok(resp)) Fail(req, resp);
    for (std::string_view u : Elements(resp.body, "Upload")) {
      out.push_back({Text(u, "Key"), Text(u, "UploadId"), Text(u, "Initiated")});
    }
    if (Text(resp.body, "IsTruncated") != "true") break;
    const std::string nk = Text(resp.body, "NextKeyMarker"), ni = Text(resp.body, "NextUploadIdMarker");
    if (nk.empty() || (nk == key_marker && ni == id_marker)) {
      throw Error(ErrorCode::kIO, req.Name() + ": ListMultipartUploads: a truncated page without a new marker");
    }
    key_marker = nk;
    id_marker = ni;
  }
  return out;
}

void S3Store::GetRange(const std::string& bucket, const std::string& key, uint64_t offset, std::span<std::byte> out) {
  if (out.empty()) return;
  const uint64_t last = offset + out.size() - 1;
  Request req{.method = "GET", .bucket = bucket, .key = key,
              .headers = {{"Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(last)}},
              .out = out, .to_out = true};
  const Response resp = Send(req);
  const std::string range = "bytes " + std::to_string(offset) + "-" + std::to_string(last) + "/";
  if (resp.status == 206) {
    if (resp.Header("content-range").rfind(range, 0) != 0) {
      throw Error(ErrorCode::kIO, req.Name() + ": GET bytes " + std::to_string(offset) + "-" + std::to_string(last) +
                                      ": the server answered the range '" + resp.Header("content-range") + "'");
    }
  } else if (resp.status == 200) {
    if (offset != 0) {
      throw Error(ErrorCode::kIO, req.Name() + ": GET bytes " + std::to_string(offset) + "-" + std::to_string(last) +
                                      ": the server ignored the range");
    }
  } else if (resp.status == 416) {
    throw Error(ErrorCode::kIO, req.Name() + ": bytes " + std::to_string(offset) + "-" + std::to_string(last) +
                                    " lie past the end of the object (HTTP 416)");
  } else {
    Fail(req, resp);
  }
  if (resp.written != out.size()) {
    throw Error(ErrorCode::kIO, req.Name() + ": GET bytes " + std::to_string(offset) + "-" + std::to_string(last) +
                                    ": got " + std::to_string(resp.written) + " of " + std::to_string(out.size()) +
                                    " bytes");
  }
}

std::vector<std::byte> S3Store::Get(const std::string& bucket, const std::string& key, uint64_t max_bytes) {
  Request req{.method = "GET", .bucket = bucket, .key = key, .max_body = max_bytes};
  const Response resp = Send(req);
  if (!Ok(resp)) Fail(req, resp);
  const std::string len = resp.Header("content-length");
  if (!len.empty() && ParseU64(len, req.Name()) != resp.body.size()) {
    throw Error(ErrorCode::kIO, req.Name() + ": GET: got " + std::to_string(resp.body.size()) + " bytes, Content-Length " + len);
  }
  std::vector<std::byte> out(resp.body.size());
  if (!out.empty()) std::memcpy(out.data(), resp.body.data(), out.size());
  return out;
}

std::optional<ObjectInfo> S3Store::Head(const std::string& bucket, const std::string& key) {
  Request req{.method = "HEAD", .bucket = bucket, .key = key};
  const Response resp = Send(req);
  if (resp.status == 404) return std::nullopt;
  if (!Ok(resp)) Fail(req, resp, resp.status == 403 ? "credentials from " + config_.credentials_source : "");
  ObjectInfo info;
  info.key = key;
  info.size = ParseU64(resp.Header("content-length"), req.Name() + ": HEAD Content-Length");
  info.etag = Unquote(resp.Header("etag"));
  info.last_modified = resp.Header("last-modified");
  return info;
}

ListPage S3Store::List(const std::string& bucket, const std::string& prefix, const std::string& token, int max_keys) {
  Request req{.method = "GET", .bucket = bucket, .query = {{"list-type", "2"}, {"max-keys", std::to_string(max_keys)}}};
  if (!prefix.empty()) req.query.emplace_back("prefix", prefix);
  if (!token.empty()) req.query.emplace_back("continuation-token", token);
  const Response resp = Send(req);
  if (!Ok(resp)) Fail(req, resp, prefix.empty() ? "" : "listing prefix '" + prefix + "'");
  ListPage page;
  for (std::string_view c : Elements(resp.body, "Contents")) {
    ObjectInfo info;
    info.key = Text(c, "Key");
    info.size = ParseU64(Text(c, "Size"), req.Name() + ": ListObjectsV2 Size of '" + info.key + "'");
    info.etag = Unquote(Text(c, "ETag"));
    info.last_modified = Text(c, "LastModified");
    page.objects.push_back(std::move(info));
  }
  if (Text(resp.body, "IsTruncated") == "true") {
    page.next_token = Text(resp.body, "NextContinuationToken");
    if (page.next_token.empty() || page.next_token == token) {
      throw Error(ErrorCode::kIO, req.Name() + ": ListObjectsV2: a truncated page without a new continuation token");
    }
  }
  return page;
}

void S3Store::DeleteBatch(const std::string& bucket, const std::vector<std::string>& keys) {
  for (std::size_t begin = 0; begin < keys.size(); begin += kDeleteBatch) {
    const std::size_t end = std::min(keys.size(), begin + kDeleteBatch);
    std::string xml = "<Delete><Quiet>true</Quiet>";
    for (std::size_t i = begin; i < end; ++i) xml += "<Object><Key>" + XmlEscape(keys[i]) + "</Key></Object>";
    xml += "</Delete>";
    Request req{.method = "POST", .bucket = bucket, .query = {{"delete", ""}}, .content_md5 = true,
                .body = s3::AsBytes(xml)};
    const Response resp = Send(req);
    if (!Ok(resp)) Fail(req, resp, "deleting " + std::to_string(end - begin) + " keys");
    const auto errors = Elements(resp.body, "Error");
    if (!errors.empty()) {
      std::string what = req.Name() + ": DeleteObjects failed for " + std::to_string(errors.size()) + " keys:";
      for (std::size_t i = 0; i < errors.size() && i < 5; ++i) {
        what += " '" + Text(errors[i], "Key") + "' (" + Text(errors[i], "Code") + ")";
      }
      throw Error(ErrorCode::kIO, what);
    }
  }
}

}  // namespace ckpt::storage
