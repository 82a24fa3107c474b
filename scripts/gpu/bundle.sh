#!/usr/bin/env bash
# Packs what a GPU machine lacks to build and test mlptrain (MPICH, parallel HDF5 and its tools,
# Boost.ProgramOptions, oneDNN, GoogleTest, nlohmann-json, fmt, zlib, ISA-L, pkgconf, and the shared
# libraries they load) from this Debian 12 machine's package archive into one file,
# gpu-bundle/root.tar.xz (git ignores gpu-bundle/): the packages are downloaded with apt-get,
# unpacked with dpkg-deb into a root of their own (never into /), stripped of what neither the
# build nor the runs read (static libraries, manuals, Fortran), and given the unversioned
# library names the linker asks for. scripts/gpu/check.sh unpacks it on the GPU machine.
#
# usage: scripts/gpu/bundle.sh            (then carry gpu-bundle with the device tool)
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=(
  # what the build compiles and links against
  libmpich-dev libmpich12 libhdf5-mpich-dev libhdf5-mpich-103-1 libhdf5-mpich-hl-100
  libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libdnnl-dev libdnnl2 libgtest-dev nlohmann-json3-dev libfmt-dev libfmt9 zlib1g-dev libisal-dev libisal2 librandom123-dev
  # the launcher, the HDF5 tools (checkpoints read without h5py; they load the serial HDF5
  # library) and pkg-config itself
  mpich hdf5-tools libhdf5-103-1 libhdf5-hl-100 pkgconf pkgconf-bin libpkgconf3
  # the libraries those load in turn (a GPU machine's distribution may lack them or name them
  # otherwise)
  libucx0 libhwloc15 libnuma1 libslurm38 libaec0 libsz2 libcurl4 libnghttp2-14 libpsl5 librtmp1
  libssh2-1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libgssapi-krb5-2 libkrb5-3 libk5crypto3
  libkrb5support0 libkeyutils1 libcom-err2 libbrotli1 libzstd1 libssl3 libgnutls30 libhogweed6
  libnettle8 libgmp10 libidn2-0 libunistring2 libtasn1-6 libp11-kit0 libffi8 ocl-icd-libopencl1
  libudev1
)

bundle=gpu-bundle
rm -rf "$bundle/debs" "$bundle/root"
mkdir -p "$bundle/debs" "$bundle/root"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] || $sudo apt-get update -qq
# apt-get's own failure ends the script (pipefail); only its note about the sandbox is dropped.
(cd "$bundle/debs" && apt-get download -qq "${packages[@]}" 2>&1 | { grep -v "unsandboxed" || true; })
for deb in "$bundle"/debs/*.deb; do dpkg-deb -x "$deb" "$bundle/root"; done

root="$bundle/root"
libraries="$root/usr/lib/x86_64-linux-gnu"
# GoogleTest ships static libraries only: those stay.
find "$root" \( \( -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' \) -o -name '*.mod' -o -name '*fortran*' \) \
  -type f -delete
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" "$root/etc/alternatives"
# Debian points generic names (libmpi.so, hdf5.pc) through /etc/alternatives, outside the root:
# keep only the packages' own names (mpich.pc, hdf5-mpich.pc), which the build asks for.
find "$root" -xtype l -delete
# The unversioned names the link step asks for (-lhwloc -lucp ...) where no -dev package is
# carried: libfoo.so -> libfoo.so.N.
for library in "$libraries"/lib*.so.* "$libraries"/hdf5/mpich/lib*.so.*; do
  [ -e "$library" ] || continue
  plain="${library%%.so.*}.so"
  [ -e "$plain" ] || ln -s "$(basename "$library")" "$plain"
done
tar -C "$bundle" -cJf "$bundle/root.tar.xz" root
rm -rf "$bundle/debs"
echo "bundle: $(du -h "$bundle/root.tar.xz" | cut -f1) in $bundle/root.tar.xz ($(du -sh "$root" | cut -f1) unpacked in $root)"
