#!/usr/bin/env python3
"""Checks the top-level Dockerfile against the binaries it ships.

    dockerfile_test.py --root SOURCE_DIR CORTIQ_SERVER CORTIQ [...]

* The runtime stage's `apt-get install` list holds the Debian package of every
  shared library the built binaries load (`ldd` → path → `dpkg -S`), except the
  packages the debian:bookworm base image has already (BASE_IMAGE_PACKAGES),
  and nothing else (no -dev package, no library the binaries do not load).
* The build stage installs through scripts/bootstrap.sh and builds with
  CMake/Ninja, tests off, and copies every source folder CMakeLists.txt adds.
* The runtime stage runs as a non-root user, exposes 50051 and 9464, listens
  on 0.0.0.0, has a HEALTHCHECK through `cortiq ... health`, and carries the
  two binaries and the embedded model in /usr/share/cortiq/model.

Needs a Debian system (dpkg) where the binaries were built: the packages
found are the host's, which for a Debian 12 host are the image's.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

# Packages of the debian:bookworm image that provide shared libraries
# (`docker run --rm debian:bookworm dpkg-query -W`): the runtime stage need not
# install them. libc6 (libc, libm, ld-linux), libgcc-s1, libstdc++6 and zlib1g
# are the ones the binaries use today.
# Sanitizer runtimes: linked only by `scripts/test.sh --sanitize` builds,
# never by the image's (the Dockerfile builds without sanitizers).
SANITIZER_RUNTIMES = {"libasan8", "libubsan1", "liblsan0", "libtsan2"}

BASE_IMAGE_PACKAGES = {
    "libc6", "libc-bin", "libgcc-s1", "libstdc++6", "gcc-12-base", "zlib1g",
    "libacl1", "libapt-pkg6.0", "libattr1", "libaudit1", "libblkid1", "libbz2-1.0",
    "libcap-ng0", "libcap2", "libcom-err2", "libcrypt1", "libdb5.3", "libdebconfclient0",
    "libext2fs2", "libffi8", "libgcrypt20", "libgmp10", "libgnutls30", "libgpg-error0",
    "libhogweed6", "libidn2-0", "liblz4-1", "liblzma5", "libmd0", "libmount1", "libnettle8",
    "libp11-kit0", "libpam0g", "libpcre2-8-0", "libseccomp2", "libselinux1", "libsemanage2",
    "libsepol2", "libsmartcols1", "libss2", "libsystemd0", "libtasn1-6", "libtinfo6",
    "libudev1", "libunistring2", "libuuid1", "libxxhash0", "libzstd1",
}
# What a runtime stage may install beyond the binaries' libraries.
ALLOWED_EXTRA = {"ca-certificates", "tini"}

failures = []


def check(cond, message):
    print(("ok    " if cond else "FAIL  ") + message)
    if not cond:
        failures.append(message)
    return cond


# --- Dockerfile parsing -----------------------------------------------------

def instructions(text):
    """[(INSTRUCTION, argument string)] with continuations joined, comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        if cur and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    if cur.strip():
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(instrs):
    """[{'name', 'base', 'instrs'}] in order."""
    result = []
    for word, arg in instrs:
        if word == "FROM":
            parts = arg.split()
            parts = [p for p in parts if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].lower() == "as" else str(len(result))
            result.append({"name": name, "base": parts[0], "instrs": []})
        elif result:
            result[-1]["instrs"].append((word, arg))
    return result


def exec_form(arg):
    """The words of an instruction in exec (JSON) or shell form."""
    arg = arg.strip()
    if arg.startswith("["):
        return json.loads(arg)
    return shlex.split(arg)


def apt_packages(run_arg):
    """Package names after `apt-get install` in one RUN command line."""
    pkgs = []
    for m in re.finditer(r"apt-get\s+install\b", run_arg):
        rest = run_arg[m.end():]
        for tok in shlex.split(re.split(r"&&|;|\|\|?", rest)[0]):
            if tok.startswith("-"):
                continue
            pkgs.append(tok)
    return pkgs


# --- ldd / dpkg -------------------------------------------------------------

def ldd_paths(binary):
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if not check(r.returncode == 0, f"ldd {binary}"):
        print(r.stderr)
        return []
    paths = []
    for line in r.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            check(False, f"{binary}: unresolved library: {line}")
            continue
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" ")[0]
            if target.startswith("/"):
                paths.append(target)
        elif line.startswith("/"):
            paths.append(line.split(" ")[0])
        # linux-vdso.so.1 and the like: provided by the kernel
    return paths


def path_variants(path):
    real = os.path.realpath(path)
    out = []
    for p in (path, real):
        out.append(p)
        # usr-merge: dpkg may know a file under /lib or under /usr/lib.
        if p.startswith("/usr/"):
            out.append(p[len("/usr"):])
        else:
            out.append("/usr" + p)
    seen = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen


def dpkg_owners(paths):
    """{path: package} for every path (or a usr-merge / symlink variant of it)
    dpkg knows; one `dpkg -S` call for all of them."""
    variants = {p: path_variants(p) for p in paths}
    query = sorted({v for vs in variants.values() for v in vs})
    r = subprocess.run(["dpkg", "-S"] + query, capture_output=True, text=True)
    owner = {}
    for line in r.stdout.splitlines():
        if line.startswith("diversion by") or ": " not in line:
            continue
        owners, path = line.rsplit(": ", 1)
        owner[path.strip()] = sorted({o.strip().split(":")[0] for o in owners.split(",")})[0]
    return {p: next((owner[v] for v in vs if v in owner), None) for p, vs in variants.items()}


# --- main -------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()

    with open(os.path.join(a.root, "Dockerfile"), encoding="utf-8") as f:
        text = f.read()
    st = stages(instructions(text))
    if not check(len(st) >= 2, f"multi-stage Dockerfile ({len(st)} stages)"):
        return 1
    for s in st:
        check(s["base"] == "debian:bookworm", f"stage {s['name']} is FROM debian:bookworm ({s['base']})")
    runtime = st[-1]
    build = [s for s in st[:-1] if any(w == "RUN" and "scripts/bootstrap.sh" in arg for w, arg in s["instrs"])]
    check(bool(build), "a build stage runs scripts/bootstrap.sh")
    build = build[0] if build else st[0]
    runs = " && ".join(arg for w, arg in build["instrs"] if w == "RUN")
    check(not any(apt_packages(arg) for w, arg in build["instrs"] if w == "RUN"),
          "the build stage installs packages only through scripts/bootstrap.sh (one list)")
    check("-G Ninja" in runs and "cmake --build" in runs, "the build stage builds with CMake/Ninja")
    check("-DCORTIQ_BUILD_TESTS=OFF" in runs, "the build stage builds without tests")
    for target in ("cortiq-server", "cortiq"):
        check(re.search(r"--target\b[^&;]*\b%s\b" % re.escape(target), runs) is not None,
              f"the build stage builds {target}")

    # Every source folder CMakeLists.txt adds (tests aside) is copied in.
    with open(os.path.join(a.root, "CMakeLists.txt"), encoding="utf-8") as f:
        subdirs = sorted(set(re.findall(r"add_subdirectory\(\s*([^)\s]+)", f.read())))
    copied = []
    for w, arg in build["instrs"]:
        if w == "COPY" and "--from" not in arg:
            words = [x for x in exec_form(arg) if not x.startswith("--")]
            copied += [x.rstrip("/") for x in words[:-1]]
    for d in subdirs:
        if d.split("/")[0] == "tests":
            continue
        check(d in copied or "." in copied, f"the build stage copies {d}/")
    for src in copied:
        if src != "." and "*" not in src:
            check(os.path.exists(os.path.join(a.root, src)), f"COPY source {src} exists")

    # Runtime packages vs the binaries' libraries.
    installed = []
    for w, arg in runtime["instrs"]:
        if w == "RUN":
            installed += apt_packages(arg)
    check(bool(installed), f"the runtime stage installs packages: {' '.join(installed)}")
    needed = {}
    libs = []
    for b in a.binaries:
        check(os.access(b, os.X_OK), f"binary {b}")
        libs += [p for p in ldd_paths(b) if p not in libs]
    owners = dpkg_owners(libs)
    for lib in libs:
        pkg = owners[lib]
        if pkg is None:
            check(False, f"dpkg -S {lib}: no package owns it")
        else:
            needed.setdefault(pkg, set()).add(os.path.basename(lib))
    for pkg in sorted(needed):
        names = sorted(needed[pkg])
        names = ", ".join(names if len(names) <= 4 else names[:3] + [f"... {len(names)} libraries"])
        if pkg in BASE_IMAGE_PACKAGES:
            print(f"      {pkg} (in debian:bookworm already): {names}")
            continue
        if pkg in SANITIZER_RUNTIMES:
            print(f"      {pkg} (sanitizer build only): {names}")
            continue
        check(pkg in installed, f"runtime stage installs {pkg} ({names})")
    for pkg in installed:
        check(pkg in needed or pkg in ALLOWED_EXTRA,
              f"runtime package {pkg} is needed: a library the binaries load"
              + ("" if pkg in needed else f" (or one of {sorted(ALLOWED_EXTRA)})"))

    # User, ports, health check, entry point, contents.
    users = [arg for w, arg in runtime["instrs"] if w == "USER"]
    user = users[-1].split(":")[0] if users else "root"
    check(user not in ("root", "0"), f"runtime USER is not root ({user})")
    exposed = set()
    for w, arg in runtime["instrs"]:
        if w == "EXPOSE":
            exposed |= {p.split("/")[0] for p in arg.split()}
    check({"50051", "9464"} <= exposed, f"EXPOSE 50051 and 9464 ({sorted(exposed)})")
    hc = [arg for w, arg in runtime["instrs"] if w == "HEALTHCHECK"]
    check(bool(hc) and "NONE" not in hc[-1].split() and re.search(r"\bcortiq\b.*\bhealth\b", hc[-1]) is not None,
          "HEALTHCHECK runs `cortiq ... health` (grpc.health.v1)")
    start = " ".join(" ".join(exec_form(arg)) for w, arg in runtime["instrs"] if w in ("ENTRYPOINT", "CMD"))
    check("cortiq-server" in start, "ENTRYPOINT/CMD starts cortiq-server")
    check(re.search(r"--listen[ =]0\.0\.0\.0:50051", start) is not None, "listens on 0.0.0.0:50051")
    check(re.search(r"--metrics-listen[ =]0\.0\.0\.0:9464", start) is not None, "metrics on 0.0.0.0:9464")
    # Secure by default: no way around the token baked in (the server then
    # refuses 0.0.0.0 until a token is given from a secret), no token either.
    check("--insecure" not in start, "ENTRYPOINT/CMD does not pass --insecure")
    check(re.search(r"--(auth|peer)-token[ =]", start) is None, "ENTRYPOINT/CMD has no literal token")
    check(not any(w == "ENV" and "TOKEN" in arg for w, arg in runtime["instrs"]), "no token in ENV")
    copies = [exec_form(arg) for w, arg in runtime["instrs"] if w == "COPY"]
    check(any(c[-1].rstrip("/") == "/usr/share/cortiq/model" and any("models/cortiq-byte-4m" in x for x in c)
              for c in copies), "the embedded model is copied to /usr/share/cortiq/model")
    bins = " ".join(" ".join(c) for c in copies if c[-1].rstrip("/") in ("/usr/bin", "/usr/local/bin"))
    check("cortiq-server" in bins and re.search(r"/cortiq(\s|$)", bins) is not None,
          "cortiq-server and cortiq are copied to /usr/bin")
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
