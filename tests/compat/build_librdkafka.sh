#!/usr/bin/env bash
# Build librdkafka 2.12.1 and its integration-test runner for `make compat` (and the fast
# subset in `make test`), from the sources the npm package node-rdkafka 3.6.0 ships.
#
#   tests/compat/build_librdkafka.sh BUILD_DIR
#
# Nothing fetched goes into the repository: BUILD_DIR is under build/ (git-ignored).
# npm only downloads the package (`npm pack`: no Node build, no install scripts).
# Compression: zlib, lz4 and snappy as librdkafka builds them here; zstd, SASL, curl and
# GSSAPI are left out (the tests that need them skip themselves or are allowlisted).
# RapidJSON (headers only), which the tests use to check statistics JSON, comes from
# the sdist of the PyPI package python-rapidjson ($PIP download, no build).
set -euo pipefail

build=${1:?usage: $0 BUILD_DIR}
package=node-rdkafka
version=3.6.0
# npm's integrity of node-rdkafka-3.6.0.tgz: a different tarball is refused.
integrity=sha512-FntdqNV+Q6D7Yb54xn2IuQIBGr/cT+MjFo/4JTXKRikSP0rRkEMY7vZoNd0HJY334b/oaY7dv3+OnY7DGsSbiQ==
stamp="$build/.built-$package-$version"
rapidjson_sdist=python_rapidjson-1.25.tar.gz
rapidjson_sha256=97c1de449552ec28ac5ae89350c2b53e4c5d21a9b4308d7a1630b1099e5db9fc
pip=${PIP:-pip}

if [[ -e $stamp ]]; then
    exit 0
fi
mkdir -p "$build"
cd "$build"
if [[ ! -e $package-$version.tgz ]]; then
    echo "compat: downloading $package@$version with npm pack" >&2
    npm pack --silent "$package@$version" > /dev/null
fi
actual="sha512-$(openssl dgst -sha512 -binary "$package-$version.tgz" | base64 -w0)"
if [[ $actual != "$integrity" ]]; then
    echo "compat: $package-$version.tgz has integrity $actual, expected $integrity" >&2
    exit 1
fi
if [[ ! -e $rapidjson_sdist ]]; then
    echo "compat: downloading python-rapidjson's sdist (RapidJSON's headers) with pip" >&2
    "$pip" download --quiet --no-deps --no-binary :all: python-rapidjson==1.25 -d .
fi
echo "$rapidjson_sha256  $rapidjson_sdist" | sha256sum --check --quiet
rm -rf package python_rapidjson-1.25
tar xzf "$package-$version.tgz"
tar xzf "$rapidjson_sdist" python_rapidjson-1.25/rapidjson/include
rapidjson_include="$(pwd)/python_rapidjson-1.25/rapidjson/include"
cd package/deps/librdkafka
echo "compat: building librdkafka (configure, libs, tests: about a minute on 2 cores)" >&2
CPPFLAGS="-I$rapidjson_include" ./configure --disable-gssapi --disable-sasl --disable-curl --disable-zstd \
    > ../../../configure.log 2>&1 || { tail -20 ../../../configure.log >&2; exit 1; }
grep -q "define WITH_RAPIDJSON 1" config.h || { echo "compat: RapidJSON not found by configure" >&2; exit 1; }
make -j"$(nproc)" libs > ../../../make-libs.log 2>&1 || { tail -20 ../../../make-libs.log >&2; exit 1; }
make -j"$(nproc)" -C tests build > ../../../make-tests.log 2>&1 || { tail -20 ../../../make-tests.log >&2; exit 1; }
test -x tests/test-runner
touch "../../../$(basename "$stamp")"
echo "compat: built $(pwd)/tests/test-runner" >&2
