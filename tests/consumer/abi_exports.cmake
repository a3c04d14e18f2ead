# Script mode: the dynamic symbols libckpt.so defines are its public API (ckpt/*.h, marked
# CKPT_API) and nothing else: no storage::, h5::, layout::, internal::, no ckpt::ops:: (the
# tools' logic is libckpt_tools.so, a library of its own over this one), and no
# symbol of the code it inlines (xxhash, nlohmann::json) or links.
#   cmake -DNM=nm -DLIB=libckpt.so -P abi_exports.cmake
execute_process(COMMAND ${NM} -DC --defined-only ${LIB} RESULT_VARIABLE rc OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} ${LIB} failed (${rc}): ${err}")
endif()
string(REPLACE ";" "\\;" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
set(functions 0)
set(leaked "")
foreach(line ${lines})
  if(NOT line MATCHES "^[0-9a-f]+ ([A-Za-z]) (.*)$")
    continue()
  endif()
  set(type ${CMAKE_MATCH_1})
  set(sym "${CMAKE_MATCH_2}")
  if(type STREQUAL "T" AND sym MATCHES "^ckpt::")
    math(EXPR functions "${functions} + 1")
  endif()
  # The entity named, not the template arguments (std:: templates instantiated over an
  # internal lambda are the standard library's, and stay visible).
  string(REGEX REPLACE "^(typeinfo name|typeinfo|vtable|VTT|guard variable) for " "" entity "${sym}")
  if(entity MATCHES "^([^<( ]+ )?(ckpt::(storage|h5|layout|internal|detail|ops)::|ckpt::\\(anonymous|nlohmann::|XXH|ZSTD_|H5)")
    list(APPEND leaked "${type} ${sym}")
  endif()
endforeach()
# What every consumer links must be there (a library that exports nothing fails here too).
foreach(required
    "ckpt::Save(" "ckpt::Load(" "ckpt::CheckpointReader::Open(" "ckpt::CheckpointWriter::Create("
    "ckpt::ParseMetadata(" "ckpt::RunThreads(" "ckpt::VerifyCheckpoint("
    "typeinfo for ckpt::Error" "typeinfo for ckpt::Comm")
  string(FIND "${out}" "${required}" at)
  if(at LESS 0)
    list(APPEND leaked "missing: ${required}")
  endif()
endforeach()
list(LENGTH leaked n)
if(n GREATER 0)
  list(JOIN leaked "\n  " text)
  message(FATAL_ERROR "${LIB}: ${n} symbols that are not its public API (or missing):\n  ${text}")
endif()
message(STATUS "${LIB}: ${functions} exported ckpt:: functions, all public API")
