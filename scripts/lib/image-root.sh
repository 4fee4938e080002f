# Sourced by scripts/image.sh and scripts/release.sh: what the Dockerfile's
# final stage declares, and the file system of the operator image made from
# a binary without a container engine.
#
#   dockerfile_image_spec        sets ENTRYPOINT_JSON CMD_JSON USER_ID EXPOSE COPY_DEST
#   image_root BINARY ROOT       fills ROOT: the binary at COPY_DEST, the C
#                                runtime libraries it links, a CA bundle, the
#                                non-root user 65532, /tmp

# INSTRUCTION's exec-form JSON array, from the Dockerfile's last stage.
dockerfile_json() {
  sed -n "s/^$1 \(\[.*\]\)\s*$/\1/p" Dockerfile | tail -1
}

dockerfile_image_spec() {
  ENTRYPOINT_JSON=$(dockerfile_json ENTRYPOINT)
  CMD_JSON=$(dockerfile_json CMD)
  USER_ID=$(sed -n 's/^USER \(.*\)$/\1/p' Dockerfile | tail -1)
  EXPOSE=$(sed -n 's/^EXPOSE \(.*\)$/\1/p' Dockerfile | tail -1 | tr ' ' ',')
  COPY_DEST=$(sed -n 's/^COPY --from=builder \S* \(\S*\)$/\1/p' Dockerfile | tail -1)
  [ -n "$ENTRYPOINT_JSON" ] && [ -n "$USER_ID" ] && [ -n "$COPY_DEST" ] || {
    echo "cannot read ENTRYPOINT, USER and the binary's path from the Dockerfile" >&2
    return 1
  }
}

image_root() {
  local bin=$1 root=$2 lib
  dockerfile_image_spec
  install -D -m 0755 "$bin" "$root$COPY_DEST"
  # The shared libraries it links (libc, libm, libgcc_s, the loader).
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
    cp --parents -L "$lib" "$root/"
  done
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  mkdir -p "$root/home/nonroot"
  # Fixed modes whatever the umask, so the same binary gives the same layer.
  find "$root" -type d -exec chmod 0755 {} + && chmod 1777 "$root/tmp"
  find "$root" -type f ! -path "*$COPY_DEST" -exec chmod 0644 {} +
  find "$root" -type f -name 'ld-linux*' -exec chmod 0755 {} +
}
