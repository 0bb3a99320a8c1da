# shellcheck shell=bash
# What scripts/test and scripts/test-compat need on the machine, checked as the
# tools that use it check (sourced, not run).

# libclang_found [DIR...]: whether a directory holds the libclang that bindgen
# (clang-sys) loads: libclang.so, libclang.so.<N>, libclang-<N>.so or
# libclang-<N>.so.<M>. Not libclang-cpp.so.<N>, the C++ library Debian ships
# without libclang-dev, which bindgen cannot use. Without arguments, the
# directories clang-sys searches on Debian (and $LIBCLANG_PATH).
libclang_found() {
  local dirs=("$@")
  if [ ${#dirs[@]} -eq 0 ]; then
    dirs=(${LIBCLANG_PATH:+"$LIBCLANG_PATH"} /usr/lib/llvm-*/lib /usr/lib/*-linux-gnu /usr/lib64 /usr/lib /usr/local/lib)
  fi
  local dir file name
  for dir in "${dirs[@]}"; do
    [ -d "$dir" ] || continue
    for file in "$dir"/libclang*.so*; do
      [ -e "$file" ] || continue
      name=${file##*/}
      # libclang.so, libclang.so.17, libclang-14.so, libclang-14.so.1
      if [[ "$name" =~ ^libclang(-[0-9][0-9.]*)?\.so(\.[0-9][0-9.]*)?$ ]]; then
        return 0
      fi
    done
  done
  return 1
}
