// tests/fuzz/fuzz_metadata.cc: bytes -> ckpt::ParseMetadata (metadata.json, FORMAT.md §3).
//
// Properties: parsing never crashes, hangs or leaks, and the only exception is ckpt::Error;
// whatever parses serialises, and that text parses again to the same text (round trip).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ckpt::Metadata metadata;
  try {
    metadata = ckpt::ParseMetadata(text);
  } catch (const ckpt::Error&) {
    return 0;  // rejected: the expected outcome for most inputs
  }
  const std::string first = ckpt::SerializeMetadata(metadata);
  ckpt::Metadata again;
  try {
    again = ckpt::ParseMetadata(first, "re-serialised metadata.json");
  } catch (const ckpt::Error& e) {
    ckpt_fuzz::Fail(std::string("parsed metadata does not parse after SerializeMetadata: ") + e.what() +
                    "\n--- serialised ---\n" + first);
  }
  const std::string second = ckpt::SerializeMetadata(again);
  if (second != first) {
    ckpt_fuzz::Fail("round trip changed the text\n--- first ---\n" + first + "--- second ---\n" + second);
  }
  return 0;
}
