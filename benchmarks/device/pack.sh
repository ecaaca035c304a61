#!/usr/bin/env bash
# At most 8 files come back from the device: pack $OUT into tar parts of 15 MB named NAME.tar.NN.
name=${1:?name}
cd "$OUT" || exit 1
tar cf "/tmp/$name.tar" --exclude='*.tar.*' . && find . -mindepth 1 -maxdepth 1 ! -name '*.tar.*' -exec rm -rf {} + \
  && split -b 15M -d "/tmp/$name.tar" "$name.tar."
ls -la "$OUT"
