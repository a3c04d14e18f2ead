"""python scripts/wheel_check.py: the ckpt package that this Python imports is an installed
wheel (not a build tree or source checkout), and its extension maps HDF5, zstd and xxhash (and,
where it has the S3 client, ckpt.HAVE_S3: libcurl and OpenSSL's libcrypto) from the wheel's own
ckpt.libs folder, none of them from the system. CKPT_WHEEL_EXPECT_S3=1: a wheel without the
S3 client is an error too. Exits 1 naming what is wrong.
CTest runs it as python_wheel where the Python tests run against the wheel
(CKPT_PYTHON_TESTS_WITH); scripts/build-wheel.sh's proof runs it too."""
import os
import sys
import sysconfig


def main():
    import ckpt
    import ckpt._ckpt as ext

    site = os.path.realpath(sysconfig.get_paths()["platlib"])
    pkg = os.path.dirname(os.path.realpath(ext.__file__))
    libs = os.path.join(os.path.dirname(pkg), "ckpt.libs")
    errors = []
    if pkg != os.path.join(site, "ckpt"):
        errors.append(f"ckpt's extension {ext.__file__} is not the one installed in {site}")
    if os.path.dirname(os.path.realpath(ckpt.__file__ or "")) != pkg:
        errors.append(f"ckpt {ckpt.__file__} and its extension {ext.__file__} are not one package")
    mapped = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if ".so" in os.path.basename(path):
                mapped.add(os.path.realpath(path))
    print(f"wheel_check: the S3 client (s3:// paths) is {'in' if ckpt.HAVE_S3 else 'NOT in'} this wheel")
    if os.environ.get("CKPT_WHEEL_EXPECT_S3") == "1" and not ckpt.HAVE_S3:
        errors.append("no S3 client (ckpt.HAVE_S3 is False): built without libcurl and OpenSSL found?")
    names = ("libhdf5", "libzstd", "libxxhash") + (("libcurl", "libcrypto") if ckpt.HAVE_S3 else ())
    for name in names:
        found = sorted(p for p in mapped if os.path.basename(p).startswith(name))
        if not found:
            errors.append(f"{name}: not loaded")
        for p in found:
            if os.path.dirname(p) != os.path.realpath(libs):
                errors.append(f"{name}: loaded from {p}, not from the wheel's {libs}")
        if found:
            print(f"{name}: {', '.join(found)}")
    for e in errors:
        print(f"wheel_check: {e}", file=sys.stderr)
    if not errors:
        print(f"wheel_check: ckpt {pkg}, its libraries from {libs}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
