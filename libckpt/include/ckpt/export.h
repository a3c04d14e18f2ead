// ckpt/export.h: CKPT_API marks what libckpt exports.
//
// libckpt is built with -fvisibility=hidden and -fvisibility-inlines-hidden: only the
// declarations of ckpt/*.h marked CKPT_API (and the classes they name: vtables, typeinfo)
// are visible outside the library; storage::, h5::, layout:: and the other internals are not.
// The objects are the same in a shared and a static build (so a static build reuses the
// compiler cache of a shared one); a static libckpt linked into a consumer's own shared
// library can be hidden there with -Wl,--exclude-libs,libckpt.a.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define CKPT_API __attribute__((visibility("default")))
#else
#define CKPT_API
#endif
