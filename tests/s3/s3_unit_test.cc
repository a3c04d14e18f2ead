// The S3 client's pure parts: SigV4 signing against AWS's published examples, the URI
// encoding of keys, configuration resolution (options > environment > profile files) with
// no secret in any error, and s3:// URLs. No server needed.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "ckpt/error.h"
#include "storage/s3_config.h"
#include "storage/s3_sign.h"
#include "storage/s3_store.h"
#include "error_of.h"
#include "test_util.h"

using namespace ckpt::storage::s3;
using s3_test::ErrorOf;

namespace {

// The example credentials and request of AWS's "Signature Calculations for the Authorization
// Header: Transferring Payload in a Single Chunk (AWS Signature Version 4)",
// https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html (Amazon S3
// API Reference): bucket examplebucket, us-east-1, 20130524T000000Z. The expected canonical
// requests, strings to sign and signatures below are the values printed on that page.
const Credentials kAwsExample{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

SignRequest ExampleRequest(const std::string& method, const std::string& path) {
  SignRequest r;
  r.method = method;
  r.path = path;
  r.payload_sha256 = kEmptySha256;
  r.headers["Host"] = "examplebucket.s3.amazonaws.com";
  r.headers["x-amz-date"] = "20130524T000000Z";
  r.headers["x-amz-content-sha256"] = kEmptySha256;
  return r;
}

}  // namespace

TEST_CASE("SigV4: AWS's GET Object example (Range header) signs to the published values") {
  SignRequest r = ExampleRequest("GET", "/" + UriEncode("test.txt", true));
  r.headers["Range"] = "bytes=0-9";
  const Signature s = SignV4(r, kAwsExample, "us-east-1", "s3", "20130524T000000Z");
  CHECK(s.canonical_request ==
        "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
        "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
        "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(s.string_to_sign ==
        "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  CHECK(s.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  CHECK(s.authorization ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST_CASE("SigV4: AWS's PUT Object example (a '$' in the key, a body) signs to the published signature") {
  const std::string body = "Welcome to Amazon S3.";
  SignRequest r = ExampleRequest("PUT", "/" + UriEncode("test$file.text", true));
  CHECK(r.path == "/test%24file.text");
  r.payload_sha256 = Sha256Hex(AsBytes(body));
  CHECK(r.payload_sha256 == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  r.headers["x-amz-content-sha256"] = r.payload_sha256;
  r.headers["Date"] = "Fri, 24 May 2013 00:00:00 GMT";
  r.headers["x-amz-storage-class"] = "REDUCED_REDUNDANCY";
  const Signature s = SignV4(r, kAwsExample, "us-east-1", "s3", "20130524T000000Z");
  CHECK(s.signature == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST_CASE("SigV4: AWS's GET Bucket Lifecycle and List Objects examples (query strings) sign to the published signatures") {
  SignRequest lifecycle = ExampleRequest("GET", "/");
  lifecycle.query = {{"lifecycle", ""}};
  CHECK(SignV4(lifecycle, kAwsExample, "us-east-1", "s3", "20130524T000000Z").signature ==
        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  SignRequest list = ExampleRequest("GET", "/");
  list.query = {{"prefix", "J"}, {"max-keys", "2"}};  // out of order: the canonical query sorts
  CHECK(CanonicalQuery(list.query) == "max-keys=2&prefix=J");
  CHECK(SignV4(list, kAwsExample, "us-east-1", "s3", "20130524T000000Z").signature ==
        "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST_CASE("SigV4: header values are trimmed and inner spaces folded, names lower-cased") {
  SignRequest a = ExampleRequest("GET", "/k");
  a.headers["X-Amz-Meta-Note"] = "  two   words ";
  SignRequest b = ExampleRequest("GET", "/k");
  b.headers["x-amz-meta-note"] = "two words";
  CHECK(SignV4(a, kAwsExample, "us-east-1", "s3", "20130524T000000Z").signature ==
        SignV4(b, kAwsExample, "us-east-1", "s3", "20130524T000000Z").signature);
  CHECK_THROWS_AS(SignV4(a, kAwsExample, "us-east-1", "s3", "2013-05-24"), ckpt::Error);
}

TEST_CASE("UriEncode: SigV4's rules for keys with spaces, %, +, =, @, ~, /, and UTF-8") {
  CHECK(UriEncode("a b", true) == "a%20b");
  CHECK(UriEncode("100%", true) == "100%25");
  CHECK(UriEncode("c+d", true) == "c%2Bd");
  CHECK(UriEncode("x=y", true) == "x%3Dy");
  CHECK(UriEncode("user@host", true) == "user%40host");
  CHECK(UriEncode("tilde~._-AZaz09", true) == "tilde~._-AZaz09");  // unreserved: as they are
  CHECK(UriEncode("dir/sub/file", true) == "dir/sub/file");
  CHECK(UriEncode("dir/sub/file", false) == "dir%2Fsub%2Ffile");  // in a query value
  CHECK(UriEncode("\xc3\xa9t\xc3\xa9", true) == "%C3%A9t%C3%A9");  // "été": upper-case hex of UTF-8
  CHECK(UriEncode("\xf0\x9f\x93\xa6", true) == "%F0%9F%93%A6");   // a 4-byte code point
  CHECK(UriEncode("a&b<c>?#*!'()", true) == "a%26b%3Cc%3E%3F%23%2A%21%27%28%29");
  CHECK(UriEncode("", true).empty());
}

TEST_CASE("hashes: MD5 (hex, base64 for Content-MD5) and the multipart ETag") {
  CHECK(Md5Hex(AsBytes("")) == "d41d8cd98f00b204e9800998ecf8427e");
  CHECK(Md5Base64(AsBytes("")) == "1B2M2Y8AsgTpgAmY7PhCfg==");
  CHECK(Sha256Hex(AsBytes("")) == kEmptySha256);
  // md5(md5("a") || md5("b")) in binary, then "-2": computed independently with Python's
  // hashlib (hashlib.md5(hashlib.md5(b"a").digest() + hashlib.md5(b"b").digest())).
  CHECK(MultipartEtag({Md5Hex(AsBytes("a")), Md5Hex(AsBytes("b"))}) == "96e024ba2074fe77e8e965ba43a704be-2");
  CHECK_THROWS_AS(MultipartEtag({"not-hex"}), ckpt::Error);
}

// ---- configuration ----

namespace {

struct Env {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

void WriteFile(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}


}  // namespace

TEST_CASE("config: options beat the environment, which beats the profile files") {
  ckpt_test::TempDir home("s3-home");
  WriteFile(home / ".aws/credentials",
            "# a comment\n[default]\naws_access_key_id = PROFILEKEY\naws_secret_access_key = profile-secret\n\n"
            "[other]\naws_access_key_id = OTHERKEY\naws_secret_access_key = other-secret\naws_session_token = tok\n");
  WriteFile(home / ".aws/config",
            "[default]\nregion = eu-west-1\n[profile other]\nregion = ap-south-1\ns3 =\n"
            "  addressing_style = virtual\n  endpoint_url = http://other.example:9000\n");
  Env env;
  env.vars["HOME"] = home.path().string();

  S3Config c = ResolveS3Config({}, env.lookup());  // the profile files only
  CHECK(c.credentials.access_key_id == "PROFILEKEY");
  CHECK(c.credentials.secret_access_key == "profile-secret");
  CHECK(c.region == "eu-west-1");
  CHECK(c.endpoint == "https://s3.eu-west-1.amazonaws.com");
  CHECK_FALSE(c.path_style);  // AWS's own endpoint: virtual-hosted
  CHECK(c.credentials_source.find("credentials [default]") != std::string::npos);

  env.vars["AWS_PROFILE"] = "other";
  c = ResolveS3Config({}, env.lookup());
  CHECK(c.credentials.access_key_id == "OTHERKEY");
  CHECK(c.credentials.session_token == "tok");
  CHECK(c.region == "ap-south-1");
  CHECK(c.endpoint == "http://other.example:9000");  // the nested "s3 =" settings
  CHECK_FALSE(c.path_style);                          // addressing_style = virtual

  env.vars["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  env.vars["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  env.vars["AWS_REGION"] = "us-west-2";
  env.vars["AWS_ENDPOINT_URL"] = "http://generic.example:1/";
  env.vars["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:7480/";
  c = ResolveS3Config({}, env.lookup());
  CHECK(c.credentials.access_key_id == "ENVKEY");
  CHECK(c.credentials.secret_access_key == "env-secret");
  CHECK(c.credentials.session_token.empty());  // a set: not mixed with the profile's token
  CHECK(c.credentials_source == "environment");
  CHECK(c.region == "us-west-2");
  CHECK(c.endpoint == "http://127.0.0.1:7480");  // the S3-specific variable, trailing '/' dropped
  env.vars.erase("AWS_ENDPOINT_URL_S3");
  CHECK(ResolveS3Config({}, env.lookup()).endpoint == "http://generic.example:1");

  S3Options o;
  o.access_key_id = "OPTKEY";
  o.secret_access_key = "opt-secret";
  o.region = "sa-east-1";
  o.endpoint = "https://minio.example";
  o.addressing = Addressing::kPath;
  c = ResolveS3Config(o, env.lookup());
  CHECK(c.credentials.access_key_id == "OPTKEY");
  CHECK(c.credentials_source == "options");
  CHECK(c.region == "sa-east-1");
  CHECK(c.endpoint == "https://minio.example");
  CHECK(c.path_style);
  o.profile = "default";  // an explicit profile still loses to explicit keys, not to the env
  o.access_key_id.clear();
  o.secret_access_key.clear();
  CHECK(ResolveS3Config(o, env.lookup()).credentials.access_key_id == "ENVKEY");
}

TEST_CASE("config: a custom endpoint defaults to path-style; AWS_DEFAULT_REGION; us-east-1 last") {
  Env env;
  env.vars["AWS_ACCESS_KEY_ID"] = "K";
  env.vars["AWS_SECRET_ACCESS_KEY"] = "S";
  S3Config c = ResolveS3Config({}, env.lookup());
  CHECK(c.region == "us-east-1");
  CHECK_FALSE(c.path_style);
  env.vars["AWS_DEFAULT_REGION"] = "eu-north-1";
  env.vars["AWS_ENDPOINT_URL"] = "http://127.0.0.1:7480";
  c = ResolveS3Config({}, env.lookup());
  CHECK(c.region == "eu-north-1");
  CHECK(c.path_style);
  S3Options o;
  o.addressing = Addressing::kVirtual;
  CHECK_FALSE(ResolveS3Config(o, env.lookup()).path_style);
}

TEST_CASE("config: errors name the variable, file and line, and never a secret") {
  ckpt_test::TempDir home("s3-home");
  Env env;
  env.vars["HOME"] = home.path().string();
  ckpt::ErrorCode code{};

  env.vars["AWS_ACCESS_KEY_ID"] = "AKIDONLY";
  std::string e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); }, &code);
  CHECK(code == ckpt::ErrorCode::kInvalidArgument);
  CHECK(e.find("AWS_SECRET_ACCESS_KEY is not") != std::string::npos);
  env.vars.erase("AWS_ACCESS_KEY_ID");
  env.vars["AWS_SECRET_ACCESS_KEY"] = "very-secret-value";
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); });
  CHECK(e.find("AWS_ACCESS_KEY_ID is not") != std::string::npos);
  CHECK(e.find("very-secret-value") == std::string::npos);
  env.vars.erase("AWS_SECRET_ACCESS_KEY");

  // Nothing anywhere: kNotFound, naming where it looked.
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); }, &code);
  CHECK(code == ckpt::ErrorCode::kNotFound);
  CHECK(e.find(".aws/credentials") != std::string::npos);

  // A malformed line: file and line number, not the line's text (it may hold a secret).
  WriteFile(home / ".aws/credentials", "[default]\naws_access_key_id = K\nsecret-in-a-broken-line\n");
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); }, &code);
  CHECK(code == ckpt::ErrorCode::kInvalidArgument);
  CHECK(e.find("credentials:3:") != std::string::npos);
  CHECK(e.find("secret-in-a-broken-line") == std::string::npos);

  // A key id without its secret in a profile.
  WriteFile(home / ".aws/credentials", "[default]\naws_access_key_id = K\n");
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); });
  CHECK(e.find("without aws_secret_access_key") != std::string::npos);

  // A named profile that is nowhere.
  env.vars["AWS_PROFILE"] = "nosuch";
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); }, &code);
  CHECK(code == ckpt::ErrorCode::kNotFound);
  CHECK(e.find("'nosuch'") != std::string::npos);
  env.vars.erase("AWS_PROFILE");

  // A bad endpoint and a bad addressing style.
  WriteFile(home / ".aws/credentials", "[default]\naws_access_key_id = K\naws_secret_access_key = topsecret\n");
  env.vars["AWS_ENDPOINT_URL"] = "ftp://host/path";
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); });
  CHECK(e.find("AWS_ENDPOINT_URL") != std::string::npos);
  CHECK(e.find("topsecret") == std::string::npos);
  env.vars.erase("AWS_ENDPOINT_URL");
  WriteFile(home / ".aws/config", "[default]\ns3 =\n  addressing_style = sideways\n");
  e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); });
  CHECK(e.find("sideways") != std::string::npos);
  CHECK(e.find("topsecret") == std::string::npos);

  S3Options o;
  o.access_key_id = "K";
  e = ErrorOf([&] { ResolveS3Config(o, env.lookup()); });
  CHECK(e.find("must be set together") != std::string::npos);
  o.secret_access_key = "S";
  o.max_attempts = 0;
  CHECK_THROWS_AS(ResolveS3Config(o, env.lookup()), ckpt::Error);
}

TEST_CASE("config: the CA bundle from options, AWS_CA_BUNDLE or the profile; an unreadable one names the file") {
  ckpt_test::TempDir home("s3-home");
  const std::string pem = (home / "ca.pem").string();
  WriteFile(home / "ca.pem", "not a certificate\n");
  WriteFile(home / ".aws/credentials", "[default]\naws_access_key_id = K\naws_secret_access_key = S\n");
  WriteFile(home / ".aws/config", "[default]\nca_bundle = " + pem + "\n");
  Env env;
  env.vars["HOME"] = home.path().string();
  env.vars["AWS_ENDPOINT_URL"] = "https://minio.example:9000";

  S3Config c = ResolveS3Config({}, env.lookup());  // the profile's ca_bundle
  CHECK(c.ca_bundle == pem);
  CHECK(c.ca_bundle_source.find("config [default] ca_bundle") != std::string::npos);
  const std::string missing = (home / "no-such-ca.pem").string();
  env.vars["AWS_CA_BUNDLE"] = missing;  // the environment beats the profile...
  ckpt::ErrorCode code{};
  std::string e = ErrorOf([&] { ResolveS3Config({}, env.lookup()); }, &code);
  CHECK(code == ckpt::ErrorCode::kInvalidArgument);
  CHECK(e.find("AWS_CA_BUNDLE") != std::string::npos);
  CHECK(e.find(missing) != std::string::npos);
  CHECK(e.find("https://minio.example:9000") != std::string::npos);
  S3Options o;  // ...and the options beat the environment
  o.ca_bundle = pem;
  c = ResolveS3Config(o, env.lookup());
  CHECK(c.ca_bundle == pem);
  CHECK(c.ca_bundle_source == "S3 options ca_bundle");
  o.ca_bundle = home.path().string();  // a directory is no bundle
  e = ErrorOf([&] { ResolveS3Config(o, env.lookup()); });
  CHECK(e.find("'" + home.path().string() + "'") != std::string::npos);
  // An http endpoint does not read it (as botocore): no error for a missing one.
  env.vars["AWS_ENDPOINT_URL"] = "http://127.0.0.1:7480";
  CHECK(ResolveS3Config({}, env.lookup()).ca_bundle == missing);
  env.vars.erase("AWS_CA_BUNDLE");
  env.vars.erase("AWS_ENDPOINT_URL");
  CHECK(ResolveS3Config({}, env.lookup()).ca_bundle == pem);  // AWS's https endpoint: checked, readable
}

TEST_CASE("config: the CA bundle reaches libcurl: a file with no certificate fails the first https request, named") {
  // No TLS server here: a listening socket that never answers is enough, as libcurl loads the
  // CA file when it sets up TLS on the connection, before any byte is exchanged.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ckpt_test::TempDir dir("s3-ca");
  const std::string pem = (dir / "empty-ca.pem").string();
  WriteFile(dir / "empty-ca.pem", "no certificate in here\n");
  S3Options o;
  o.endpoint = "https://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  o.access_key_id = "K";
  o.secret_access_key = "S";
  o.ca_bundle = pem;
  o.max_attempts = 1;
  o.connect_timeout_ms = 2000;
  o.stall_timeout_s = 2;
  ckpt::storage::S3Store store(o);
  const std::string e = ErrorOf([&] { store.Head("bucket", "key"); });
  ::close(fd);
  CHECK(e.find("CA bundle '" + pem + "'") != std::string::npos);
  CHECK(e.find("bucket") != std::string::npos);
}

TEST_CASE("s3:// URLs: bucket and prefix; bad ones are clear errors") {
  S3Url u = ParseS3Url("s3://my-bucket/ckpt/step-100");
  CHECK(u.bucket == "my-bucket");
  CHECK(u.prefix == "ckpt/step-100");
  u = ParseS3Url("s3://my.bucket.1");
  CHECK(u.bucket == "my.bucket.1");
  CHECK(u.prefix.empty());
  CHECK(ParseS3Url("s3://abc/dir/").prefix == "dir/");
  CHECK(IsS3Url("s3://x"));
  CHECK_FALSE(IsS3Url("/tmp/s3://x"));
  for (const char* bad : {"/local/path", "s3://", "s3:///key", "s3://UpperCase/k", "s3://ab/k", "s3://-bad/k",
                          "s3://bad-/k", "s3://a..b/k", "s3://under_score/k", "http://bucket/k"}) {
    CAPTURE(bad);
    const std::string e = ErrorOf([&] { ParseS3Url(bad); });
    CHECK(e.find(std::string("'") + bad + "'") != std::string::npos);
  }
}
