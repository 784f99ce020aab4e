#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries that tests/envtest runs:
# kube-apiserver, kube-controller-manager, kube-scheduler (Kubernetes 1.20 from
# Debian's source package, built with Debian's Go 1.19) and etcd (Debian's
# etcd-server), all into "$FAIRQ_ENVTEST_CACHE/bin".
#
# Idempotent: when the binaries are already in the cache it exits in seconds.
# Everything it builds or unpacks lives under the cache dir, never in the repo.
# Needs root (apt-get) on a Debian 12 machine whose only network is Debian's
# archive. From scratch: ~5.5 min on an idle 2-core box, ~9 min when other
# work shares the cores (nearly all of it compiling kube-apiserver).
#
# Usage: tests/envtest/build.sh [--force]
#   --force   rebuild the kube binaries even if they are cached
set -euo pipefail

CACHE="${FAIRQ_ENVTEST_CACHE:-$HOME/.cache/fairq-envtest}"
BIN="$CACHE/bin"
WORK="$CACHE/build"          # sources, GOPATH, Go build cache, temp files
K8S_VERSION_EXPECTED="1.20"  # major.minor of Debian bookworm's kubernetes source
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler)
# Bump when the recipe below changes what the binaries contain (patches,
# generated code, flags): cached binaries from an older recipe get rebuilt.
RECIPE=1
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

START=$(date +%s)
log() { printf '[envtest-build %4ds] %s\n' "$(( $(date +%s) - START ))" "$*"; }
die() { printf '[envtest-build] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$BIN" "$WORK"

# --- fast path -------------------------------------------------------------
# A binary counts as cached only if it runs (a half-written file from an
# interrupted build would not), and etcd must still run too: the cache may
# outlive the etcd-server package if the cache dir is restored onto a new box.
cached_ok() {
  local b
  for b in "${KUBE_BINS[@]}"; do
    [[ -x "$BIN/$b" ]] || return 1
    "$BIN/$b" --version >/dev/null 2>&1 || return 1
  done
  [[ -x "$BIN/etcd" ]] && "$BIN/etcd" --version >/dev/null 2>&1 || return 1
  [[ "$(cat "$BIN/.recipe" 2>/dev/null)" == "$RECIPE" ]]
}
if [[ $FORCE -eq 0 ]] && cached_ok; then
  log "cached binaries in $BIN are present and run; nothing to do"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || die "must run as root (it installs Debian packages with apt-get)"

# Two runs at once (two test sessions, a developer and CI) would fight over
# the source tree and GOPATH: serialise, then re-check what the other built.
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build.sh holds $CACHE/.build.lock; waiting"
  flock 9
fi
if [[ $FORCE -eq 0 ]] && cached_ok; then
  log "binaries were built meanwhile by another run; nothing to do"
  exit 0
fi
# Binaries without this recipe's stamp (another recipe, or a run that was
# interrupted) are rebuilt from a freshly unpacked tree; the Go build cache
# keeps that to a minute or two when little changed.
if [[ "$(cat "$BIN/.recipe" 2>/dev/null)" != "$RECIPE" ]] && compgen -G "$BIN/kube-*" >/dev/null; then
  log "cached kube binaries lack the stamp of build recipe $RECIPE: rebuilding them"
  FORCE=1
  rm -rf "$WORK/src"
fi
rm -f "$BIN/.recipe"
export DEBIAN_FRONTEND=noninteractive

# --- 1. Debian packages ----------------------------------------------------
APT_SRC_FILE=/etc/apt/sources.list.d/fairq-envtest-src.sources
have_deb_src() {
  grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null
}
APT_UPDATED=0
if ! have_deb_src; then
  log "adding deb-src entries for Debian's archive ($APT_SRC_FILE)"
  # Mirror whatever 'deb' entries the machine already uses, so the source
  # packages come from the same archive/snapshot as the binaries.
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed -E 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$APT_SRC_FILE"
  elif [[ -f /etc/apt/sources.list ]] && grep -qE '^deb ' /etc/apt/sources.list; then
    APT_SRC_FILE=/etc/apt/sources.list.d/fairq-envtest-src.list
    grep -E '^deb ' /etc/apt/sources.list | sed -E 's/^deb /deb-src /' >"$APT_SRC_FILE"
  else
    cat >"$APT_SRC_FILE" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  log "apt-get update"
  apt-get update -qq
  APT_UPDATED=1
fi

PKGS=(golang-go etcd-server golang-github-modern-go-reflect2-dev
      golang-github-json-iterator-go-dev dpkg-dev ca-certificates openssl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $APT_UPDATED -eq 0 ]]; then log "apt-get update"; apt-get update -qq; APT_UPDATED=1; fi
  log "apt-get install ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

GO=/usr/lib/go/bin/go
[[ -x $GO ]] || GO=$(command -v go) || die "go not found after installing golang-go"
log "using $($GO version)"

# etcd: copied (not linked) so the cache dir is self-contained.
if ! { [[ -x "$BIN/etcd" ]] && "$BIN/etcd" --version >/dev/null 2>&1; }; then
  cp -L /usr/bin/etcd "$BIN/etcd.tmp" && mv -f "$BIN/etcd.tmp" "$BIN/etcd"
  log "etcd: $("$BIN/etcd" --version | head -1)"
fi

# --- 2. Kubernetes source --------------------------------------------------
SRC_PARENT="$WORK/src"
mkdir -p "$SRC_PARENT"
SRC=$(find "$SRC_PARENT" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1 || true)
if [[ -z "$SRC" || ! -f "$SRC/.fairq-unpacked" ]]; then
  rm -rf "$SRC_PARENT"/kubernetes-* "$SRC_PARENT"/kubernetes_*
  log "apt-get source kubernetes (download + unpack, ~1 min)"
  if [[ $APT_UPDATED -eq 0 ]]; then apt-get update -qq; APT_UPDATED=1; fi
  # apt drops privileges to _apt for downloads; the cache dir may not be
  # readable for it, so download into a world-writable temp dir first.
  dl=$(mktemp -d "$WORK/dl.XXXXXX")
  chmod 0777 "$dl"
  (cd "$dl" && apt-get source -qq --download-only kubernetes >/dev/null)
  dsc=$(ls "$dl"/kubernetes_*.dsc | head -1)
  [[ -n "$dsc" ]] || die "apt-get source kubernetes fetched no .dsc"
  (cd "$SRC_PARENT" && dpkg-source --no-check -x "$dsc" >/dev/null)
  rm -rf "$dl"
  SRC=$(find "$SRC_PARENT" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
  [[ -d "$SRC/vendor" ]] || die "unpacked kubernetes source at $SRC has no vendor/ dir"
  touch "$SRC/.fairq-unpacked"
fi
log "kubernetes source: $SRC"

# --- 3. Patch vendor/ ------------------------------------------------------
# reflect2 1.0.1 (vendored) reads Go runtime internals that changed in Go 1.18:
# built with Go 1.19 the apiserver dies with a nil dereference decoding maps
# (e.g. on creating a Node). reflect2 1.0.2 + json-iterator 1.1.12 fix it.
patch_vendor() {
  local pkg=$1 from=/usr/share/gocode/src/$1 to="$SRC/vendor/$1"
  [[ -d "$from" ]] || die "$from missing (is the Debian -dev package installed?)"
  rm -rf "$to"
  mkdir -p "$to"
  # Only non-test Go sources and licence: Debian's tree may carry test data
  # and go.mod files that GOPATH mode does not want inside vendor/.
  (cd "$from" && find . -type f \( -name '*.go' ! -name '*_test.go' -o -name 'LICENSE*' \) \
      -not -path '*/testdata/*' -not -path '*/test/*' -not -path '*/benchmarks/*' \
      -not -path '*/skip_tests/*' -not -path '*/type_tests/*' -not -path '*/api_tests/*' \
      -not -path '*/extension_tests/*' -not -path '*/misc_tests/*' -not -path '*/any_tests/*' \
      -exec cp --parents {} "$to/" \;)
}
if [[ ! -f "$SRC/.fairq-vendor-patched" ]]; then
  log "patching vendor/: modern-go/reflect2 -> 1.0.2, json-iterator/go -> 1.1.12 (Debian)"
  patch_vendor github.com/modern-go/reflect2
  patch_vendor github.com/json-iterator/go
  touch "$SRC/.fairq-vendor-patched"
fi

# --- 4. GOPATH layout ------------------------------------------------------
export GOPATH="$WORK/gopath"
export GOCACHE="$WORK/go-build-cache"
export GO111MODULE=off
export GOFLAGS=""
export CGO_ENABLED=0
export TMPDIR="$WORK/tmp"
mkdir -p "$GOPATH/src/k8s.io" "$GOCACHE" "$TMPDIR"
ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
PKGROOT="$GOPATH/src/k8s.io/kubernetes"
cd "$PKGROOT"

# --- 5. Generated OpenAPI definitions --------------------------------------
OPENAPI_OUT="$PKGROOT/pkg/generated/openapi/zz_generated.openapi.go"
if [[ ! -s "$OPENAPI_OUT" ]]; then
  log "building openapi-gen"
  $GO build -o "$WORK/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  # Same input set as build/root/Makefile.generated_files (KUBE target):
  # every dir of the tree (staging/src named as vendor/, real vendor/ pruned)
  # holding a .go file with a "+k8s:openapi-gen=" tag, minus code-generator
  # and sample-apiserver. Missing one (e.g. resource.Quantity) would leave
  # dangling references the apiserver trips over at run time.
  log "running openapi-gen"
  inputs=$(find -H . \( -not \( \( -path './_*' -o -path './.*' -o -path ./vendor -o -path ./debian \) -prune \) \) \
             -type f -name '*.go' \
           | sed 's|^\./staging/src|vendor|; s|^\./||' \
           | grep -vE '^vendor/k8s\.io/(code-generator|sample-apiserver)/' \
           | { xargs grep -l '^// *+k8s:' || true; } | { xargs grep -l '+k8s:openapi-gen=' || true; } \
           | xargs -n1 dirname | LC_ALL=C sort -u \
           | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
  [[ -n "$inputs" ]] || die "found no packages tagged +k8s:openapi-gen=true"
  "$WORK/openapi-gen" \
    --input-dirs "$inputs" \
    --output-base "$GOPATH/src" \
    --output-package k8s.io/kubernetes/pkg/generated/openapi \
    --output-file-base zz_generated.openapi \
    --go-header-file hack/boilerplate/boilerplate.generatego.txt \
    --report-filename "$WORK/openapi-violations.report" \
    >"$WORK/openapi-gen.log" 2>&1 || { tail -30 "$WORK/openapi-gen.log" >&2; die "openapi-gen failed"; }
  [[ -s "$OPENAPI_OUT" ]] || die "openapi-gen produced no $OPENAPI_OUT"
  # The tree ships the list of API-rule violations its own generation yields;
  # a different report means a different input set (harmless to run, but say so).
  if ! diff -q "$WORK/openapi-violations.report" api/api-rules/violation_exceptions.list >/dev/null; then
    log "WARNING: openapi-gen violation report differs from api/api-rules/violation_exceptions.list"
  fi
  rm -f "$BIN/kube-apiserver"  # it embeds these definitions: rebuild it
fi

# --- 6. Build --------------------------------------------------------------
ver=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version 2>/dev/null || echo "$K8S_VERSION_EXPECTED.0")
# Debian versions look like 1.20.5+really1.20.2-1.1: the real one follows "really".
upstream=${ver%%-*}; upstream=${upstream##*really}; upstream=${upstream%%+*}
major=${upstream%%.*}; rest=${upstream#*.}; minor=${rest%%.*}
# Same -X set as hack/lib/version.sh: component-base feeds --version and the
# apiserver, client-go's copy feeds /version (served by the aggregator).
LDFLAGS="-s -w"
for vpkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
            k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $vpkg.gitVersion=v$upstream -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor"
  LDFLAGS+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
done
for b in "${KUBE_BINS[@]}"; do
  if [[ $FORCE -eq 0 && -x "$BIN/$b" ]] && "$BIN/$b" --version >/dev/null 2>&1; then
    log "$b: cached"
    continue
  fi
  case $b in
    kube-apiserver) eta="~2.5-4 min" ;; kube-controller-manager) eta="~1 min" ;; *) eta="~15 s" ;;
  esac
  log "building $b ($eta on 2 cores from scratch)"
  t0=$(date +%s)
  $GO build -trimpath -ldflags "$LDFLAGS" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b"
  mv -f "$BIN/$b.tmp" "$BIN/$b"
  log "$b built in $(( $(date +%s) - t0 ))s: $("$BIN/$b" --version)"
done

echo "$RECIPE" >"$BIN/.recipe"
cached_ok || die "binaries in $BIN do not run"
log "done: $(ls "$BIN" | tr '\n' ' ')in $BIN"
