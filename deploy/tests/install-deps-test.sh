#!/usr/bin/env bash
# Tests deploy/install-deps.sh against fake apt-get, apt-cache and dpkg-query on PATH that
# behave as apt does on this project's machine kind: qemu-utils 10 (bookworm-backports) may come
# preinstalled, installing Debian 12's qemu-system-x86 without pinning qemu-utils to 7.2
# removes qemu-utils (its Breaks: qemu-system-common << 8.0), and bookworm-backports (qemu 10
# for both) is reachable or not ($FAKE_BACKPORTS).
#
#   deploy/tests/install-deps-test.sh     # last line: "N passed, N failed"
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SCRIPT=$HERE/../install-deps.sh

passed=0 failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }

# make_fakes DIR: fake tools keeping their state in DIR/state (one "package version" a line).
make_fakes() {
  local d=$1
  mkdir -p "$d/bin"
  cat > "$d/bin/dpkg-query" <<'EOF'
#!/bin/bash
# dpkg-query -W -f=FORMAT PKG: "install ok installed VERSION" for installed packages.
pkg=${@: -1}
v=$(awk -v p="$pkg" '$1 == p {print $2}' "$FAKE_STATE")
[ -n "$v" ] || exit 1
echo "install ok installed $v"
EOF
  cat > "$d/bin/apt-cache" <<'EOF'
#!/bin/bash
# apt-cache policy PKG: Debian 12 offers 7.2 for qemu, 1.0 for the rest; an installed newer
# version stays the candidate (apt never downgrades by itself).
# apt-cache madison PKG: also bookworm-backports' qemu 10 once its list was fetched.
pkg=$2
if [ "$1" = show ]; then
  # bookworm-backports' qemu-system-x86 10 needs three packages of that suite (as the real one).
  case $pkg in
    qemu-system-x86=1:10.*)
      echo "Package: qemu-system-x86"
      echo "Depends: libc6 (>= 2.34), qemu-system-common (= 1:10.0.2+ds-2+deb13u1~bpo12+1), qemu-system-data (>> 1:10.0.2+ds~), seabios (>> 1.16.3-1~), ipxe-qemu | qemu-system-x86 (<< 1:7)" ;;
  esac
  exit 0
fi
if [ "$1" = madison ]; then
  case $pkg in
    seabios)
      ! ls "$FAKE_LISTS"/*bookworm-backports*Packages* >/dev/null 2>&1 \
        || echo " $pkg | 1.16.3-2~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages"
      echo " $pkg | 1.16.2-1 | http://deb.debian.org/debian bookworm/main amd64 Packages" ;;
    qemu-*)
      ! ls "$FAKE_LISTS"/*bookworm-backports*Packages* >/dev/null 2>&1 \
        || echo " $pkg | 1:10.0.2+ds-2+deb13u1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages"
      echo " $pkg | 1:7.2+dfsg-7+deb12u18+b3 | http://deb.debian.org/debian bookworm/main amd64 Packages" ;;
    *) echo " $pkg | 1.0 | http://deb.debian.org/debian bookworm/main amd64 Packages" ;;
  esac
  exit 0
fi
inst=$(awk -v p="$pkg" '$1 == p {print $2}' "$FAKE_STATE")
case $pkg in qemu-*) repo=1:7.2+dfsg-7+deb12u18+b3 ;; seabios) repo=1.16.2-1 ;; *) repo=1.0 ;; esac
cand=$repo
[ -n "$inst" ] && [ "$inst" != "$repo" ] && cand=$inst
echo "$pkg:"; echo "  Installed: ${inst:-(none)}"; echo "  Candidate: $cand"
EOF
  cat > "$d/bin/apt-get" <<'EOF'
#!/bin/bash
echo "apt-get $*" >> "$FAKE_LOG"
if [ "$1" = update ]; then
  # Fetches bookworm-backports' list when a source names it and it is reachable.
  rm -f "$FAKE_LISTS"/*
  if grep -qs bookworm-backports "$FAKE_SOURCES"/* && [ "$FAKE_BACKPORTS" = reachable ]; then
    : > "$FAKE_LISTS/deb.debian.org_debian_dists_bookworm-backports_main_binary-amd64_Packages"
  fi
  exit 0
fi
[ "$1" = install ] || exit 100
shift
pins=() names=()
for a in "$@"; do
  case $a in
    -*) ;;
    *=*) pins+=("$a"); names+=("${a%%=*}") ;;
    */bookworm-backports)
      ls "$FAKE_LISTS"/*bookworm-backports*Packages* >/dev/null 2>&1 \
        || { echo "E: Release 'bookworm-backports' for '${a%/*}' was not found" >&2; exit 100; }
      pins+=("${a%/*}=1:10.0.2+ds-2+deb13u1~bpo12+1"); names+=("${a%/*}") ;;
    *) names+=("$a") ;;
  esac
done
repo_version() { case $1 in qemu-*) echo 1:7.2+dfsg-7+deb12u18+b3 ;; *) echo 1.0 ;; esac; }
# As apt: qemu-system-x86 10 without its dependencies of bookworm-backports asked for too.
if printf '%s\n' "${pins[@]}" | grep -q '^qemu-system-x86=1:10' \
   && ! printf '%s\n' "${pins[@]}" | grep -q '^qemu-system-common=1:10'; then
  echo "E: Unable to correct problems, you have held broken packages." >&2
  exit 100
fi
for n in "${names[@]}"; do
  pinned=""
  for p in "${pins[@]}"; do [ "${p%%=*}" = "$n" ] && pinned=${p#*=}; done
  if [ -n "$pinned" ]; then
    sed -i "/^$n /d" "$FAKE_STATE"; echo "$n $pinned" >> "$FAKE_STATE"
  elif ! grep -q "^$n " "$FAKE_STATE"; then
    echo "$n $(repo_version "$n")" >> "$FAKE_STATE"
  fi
done
# qemu-utils 10 Breaks qemu-system-common << 8.0: apt removes it to install qemu-system-x86 7.2.
if grep -q '^qemu-system-x86 1:7' "$FAKE_STATE" && grep -q '^qemu-utils 1:10' "$FAKE_STATE"; then
  sed -i '/^qemu-utils /d' "$FAKE_STATE"
fi
# Tools appear with their packages (qemu-utils' only while it stays installed).
rm -f "$FAKE_TOOLS"/*
while read -r pkg _; do
  for t in $(sed -n "s/^\([^:]*\):$pkg\$/\1/p" "$FAKE_TOOLMAP"); do
    [[ $t == /* ]] || { printf '#!/bin/sh\nexit 0\n' > "$FAKE_TOOLS/$t"; chmod +x "$FAKE_TOOLS/$t"; }
  done
done < "$FAKE_STATE"
exit 0
EOF
  printf '#!/bin/sh\nexit 0\n' > "$d/bin/python3" # Debian's python with the nbd module
  chmod +x "$d/bin"/*
  mkdir -p "$d/tools" "$d/boot" "$d/sources" "$d/lists"
  : > "$d/boot/vmlinuz-6.1.0-57-amd64"
  echo VERSION_CODENAME=bookworm > "$d/os-release"
}

# run_case PRESTATE [PRELUDE] [BACKPORTS]: runs install_packages and check_tools in a subshell
# with only the fakes on PATH (plus the shell's basics); PRELUDE is evaluated after sourcing
# the script; BACKPORTS is "reachable" or "unreachable" (default). Leaves $d with out
# (output), rc, log (apt calls), state (installed packages), sources and lists (apt's).
run_case() {
  local prestate=$1 prelude=${2:-} backports=${3:-unreachable}
  d=$(mktemp -d)
  make_fakes "$d"
  printf '%s' "$prestate" > "$d/state"
  : > "$d/log"
  (
    # shellcheck source=../install-deps.sh
    source "$SCRIPT"
    eval "$prelude"
    printf '%s\n' "${REQUIRED_TOOLS[@]}" > "$d/toolmap"
    export FAKE_STATE=$d/state FAKE_LOG=$d/log FAKE_TOOLS=$d/tools FAKE_TOOLMAP=$d/toolmap
    export FAKE_SOURCES=$d/sources FAKE_LISTS=$d/lists FAKE_BACKPORTS=$backports
    INSTALL_DEPS_SOURCES_LIST=$d/sources.list INSTALL_DEPS_SOURCES_DIR=$d/sources
    INSTALL_DEPS_LISTS=$d/lists INSTALL_DEPS_OS_RELEASE=$d/os-release
    SUDO=""
    basics=$d/basics
    mkdir -p "$basics"
    for t in awk sed grep cat printf tee chmod rm mkdir mktemp ls bash sh env tr dpkg; do
      ln -s "$(command -v $t)" "$basics/$t" 2>/dev/null || true
    done
    export PATH="$d/bin:$d/tools:$basics"
    INSTALL_DEPS_PYTHON=$d/bin/python3 INSTALL_DEPS_BOOT=$d/boot
    install_packages && check_tools
  ) > "$d/out" 2>&1
  echo $? > "$d/rc"
}

# 1. The machine as it comes: qemu-utils 10 preinstalled. The install pins qemu-utils to 7.2 in
#    the same call as qemu-system-x86, and every tool is there afterwards.
run_case "qemu-utils 1:10.0.2+ds-2+deb13u1~bpo12+1
"
if [ "$(cat "$d/rc")" = 0 ]; then ok "newer qemu-utils preinstalled: install passes"; else bad "newer qemu-utils preinstalled: install failed: $(cat "$d/out")"; fi
if [ "$(grep -c '^apt-get install' "$d/log")" = 1 ]; then ok "one apt-get install call"; else bad "apt-get install calls: $(grep -c '^apt-get install' "$d/log")"; fi
if grep -q 'qemu-utils=1:7.2+dfsg-7+deb12u18+b3' "$d/log" && grep -q -- '--allow-downgrades' "$d/log"; then ok "qemu-utils pinned to qemu-system-x86's version"; else bad "no qemu-utils pin in: $(cat "$d/log")"; fi
if grep -q '^qemu-utils 1:7.2' "$d/state"; then ok "qemu-utils installed after apt"; else bad "qemu-utils gone: $(cat "$d/state")"; fi

# 2. Plain Debian 12: nothing installed; no pin needed (candidates agree).
run_case ""
if [ "$(cat "$d/rc")" = 0 ]; then ok "plain Debian 12: install passes"; else bad "plain Debian 12: install failed: $(cat "$d/out")"; fi
if ! grep -q 'qemu-utils=' "$d/log"; then ok "plain Debian 12: no pin"; else bad "plain Debian 12 pinned: $(cat "$d/log")"; fi

# 3. The check catches what apt removed: the same machine with the pin left out of the request
#    (the old script's behaviour) must fail naming qemu-utils.
run_case "qemu-utils 1:10.0.2+ds-2+deb13u1~bpo12+1
" 'install_requests() { printf "%s\n" "${PACKAGES[@]}"; }'
if [ "$(cat "$d/rc")" != 0 ] && grep -q 'missing qemu-io: apt-get install qemu-utils' "$d/out"; then
  ok "a tool removed by apt fails the check, naming its package"
else
  bad "removed qemu-utils not caught (rc $(cat "$d/rc")): $(cat "$d/out")"
fi

if [ ! -e "$d/sources/raidnbd-bookworm-backports.sources" ]; then ok "unreachable backports: its source removed again"; else bad "unreachable backports source left behind"; fi

# 4. A settled machine (backports fetched, qemu 10 from it): no apt call at all.
run_case "" 'for p in "${PACKAGES[@]}"; do
    case $p in qemu-*) echo "$p 1:10.0.2+ds-2+deb13u1~bpo12+1" ;; *) echo "$p 1.0" ;; esac
  done > "$d/state"
  echo "Suites: bookworm-backports" > "$d/sources/backports.sources"
  : > "$d/lists/deb.debian.org_debian_dists_bookworm-backports_main_binary-amd64_Packages"' reachable
if [ ! -s "$d/log" ]; then ok "settled machine: no apt call"; else bad "settled machine called apt: $(cat "$d/log")"; fi

# 5. Plain Debian 12 with bookworm-backports reachable: its source is added, both qemu packages
#    come from it in the one install call, and every tool is there.
run_case "" "" reachable
if [ "$(cat "$d/rc")" = 0 ]; then ok "backports reachable: install passes"; else bad "backports reachable: install failed: $(cat "$d/out")"; fi
if [ -e "$d/sources/raidnbd-bookworm-backports.sources" ]; then ok "backports source added"; else bad "no backports source added"; fi
if grep -q 'qemu-utils/bookworm-backports' "$d/log" && grep -q 'qemu-system-x86/bookworm-backports' "$d/log" \
   && [ "$(grep -c '^apt-get install' "$d/log")" = 1 ]; then
  ok "both qemu packages from bookworm-backports, one install call"
else
  bad "qemu not asked from backports in one call: $(cat "$d/log")"
fi
if grep -q 'qemu-system-common/bookworm-backports' "$d/log" && grep -q 'seabios/bookworm-backports' "$d/log" \
   && grep -q 'qemu-system-data/bookworm-backports' "$d/log" && ! grep -q 'libc6' "$d/log"; then
  ok "the dependencies only bookworm-backports satisfies are asked from it too"
else
  bad "qemu-system-x86 10's dependencies not asked from backports: $(cat "$d/log")"
fi
if grep -q '^qemu-utils 1:10' "$d/state" && grep -q '^qemu-system-x86 1:10' "$d/state"; then ok "qemu 10 installed for both"; else bad "qemu versions after apt: $(grep qemu "$d/state")"; fi

# 6. qemu-utils 10 preinstalled and backports reachable: no downgrade, no pin to 7.2.
run_case "qemu-utils 1:10.0.2+ds-2+deb13u1~bpo12+1
" "" reachable
if [ "$(cat "$d/rc")" = 0 ] && ! grep -q 'qemu-utils=1:7.2' "$d/log" && grep -q '^qemu-utils 1:10' "$d/state"; then
  ok "newer qemu-utils with backports: kept, no downgrade"
else
  bad "newer qemu-utils with backports: rc $(cat "$d/rc"), log $(cat "$d/log"), state $(grep qemu "$d/state")"
fi

# 7. A machine that is not Debian 12 gets no backports source.
run_case "" 'echo VERSION_CODENAME=trixie > "$d/os-release"' reachable
if [ ! -e "$d/sources/raidnbd-bookworm-backports.sources" ] && ! grep -q bookworm-backports "$d/log"; then
  ok "not bookworm: no backports source"
else
  bad "backports on a non-bookworm machine: $(cat "$d/log")"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
