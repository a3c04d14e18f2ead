#include "storage/s3_sign.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <ctime>

#include "ckpt/error.h"

namespace ckpt::storage::s3 {
namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string Hex(const unsigned char* p, std::size_t n) {
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

// One-shot digest with OpenSSL's EVP interface; `md` EVP_sha256() or EVP_md5().
std::vector<unsigned char> Digest(const EVP_MD* md, Bytes data) {
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), out.data(), &n, md, nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "OpenSSL EVP_Digest failed");
  }
  out.resize(n);
  return out;
}

std::vector<unsigned char> Hmac(Bytes key, std::string_view msg) {
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &n) == nullptr) {
    throw Error(ErrorCode::kInternal, "OpenSSL HMAC-SHA256 failed");
  }
  out.resize(n);
  return out;
}

Bytes AsBytes(const std::vector<unsigned char>& v) { return {reinterpret_cast<const std::byte*>(v.data()), v.size()}; }

std::string Base64(const std::vector<unsigned char>& v) {
  std::string out(4 * ((v.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), v.data(), static_cast<int>(v.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A header value as SigV4 signs it: leading and trailing spaces removed, runs of spaces
// inside folded to one.
std::string TrimValue(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string Sha256Hex(Bytes data) {
  const auto d = Digest(EVP_sha256(), data);
  return Hex(d.data(), d.size());
}

std::string Md5Hex(Bytes data) {
  const auto d = Digest(EVP_md5(), data);
  return Hex(d.data(), d.size());
}

std::string Md5Base64(Bytes data) { return Base64(Digest(EVP_md5(), data)); }

Md5Digest Md5Of(Bytes data) {
  const auto d = Digest(EVP_md5(), data);
  return {Hex(d.data(), d.size()), Base64(d)};
}

std::string MultipartEtag(const std::vector<std::string>& part_md5_hex) {
  std::string binary;
  for (const std::string& h : part_md5_hex) {
    if (h.size() != 32) throw Error(ErrorCode::kInvalidArgument, "MultipartEtag: '" + h + "' is not an MD5 in hex");
    for (std::size_t i = 0; i < 32; i += 2) {
      binary += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    }
  }
  return Md5Hex(AsBytes(std::string_view(binary))) + "-" + std::to_string(part_md5_hex.size());
}

std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kUpperHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~' || (c == '/' && keep_slash)) {
      out += ch;
    } else {
      out += '%';
      out += kUpperHex[c >> 4];
      out += kUpperHex[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(query.size());
  for (const auto& [k, v] : query) enc.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

std::string AmzDate(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%Y%m%dT%H%M%SZ", &tm);
  return buf.data();
}

Signature SignV4(const SignRequest& req, const Credentials& creds, std::string_view region,
                 std::string_view service, std::string_view amz_date) {
  if (amz_date.size() != 16) throw Error(ErrorCode::kInvalidArgument, "SigV4: bad x-amz-date '" + std::string(amz_date) + "'");
  std::map<std::string, std::string> headers;  // lower-case names, sorted
  for (const auto& [k, v] : req.headers) headers[Lower(k)] = TrimValue(v);
  std::string canonical_headers, signed_headers;
  for (const auto& [k, v] : headers) {
    canonical_headers += k + ":" + v + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += k;
  }
  Signature s;
  s.canonical_request = req.method + "\n" + req.path + "\n" + CanonicalQuery(req.query) + "\n" + canonical_headers +
                        "\n" + signed_headers + "\n" + req.payload_sha256;
  const std::string date(amz_date.substr(0, 8));
  const std::string scope = date + "/" + std::string(region) + "/" + std::string(service) + "/aws4_request";
  s.string_to_sign = "AWS4-HMAC-SHA256\n" + std::string(amz_date) + "\n" + scope + "\n" +
                     Sha256Hex(s3::AsBytes(std::string_view(s.canonical_request)));
  const std::string k_secret = "AWS4" + creds.secret_access_key;
  auto key = Hmac(s3::AsBytes(std::string_view(k_secret)), date);
  key = Hmac(AsBytes(key), region);
  key = Hmac(AsBytes(key), service);
  key = Hmac(AsBytes(key), "aws4_request");
  const auto sig = Hmac(AsBytes(key), s.string_to_sign);
  s.signature = Hex(sig.data(), sig.size());
  s.authorization = "AWS4-HMAC-SHA256 Credential=" + creds.access_key_id + "/" + scope +
                    ",SignedHeaders=" + signed_headers + ",Signature=" + s.signature;
  return s;
}

}  // namespace ckpt::storage::s3
