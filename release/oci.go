package main

// OCI image layouts: one gzip layer made from a directory, its config and
// manifest, written as an image layout (oci-layout, index.json, blobs) and
// copied to registries with oras-go.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
	"oras.land/oras-go/v2/registry/remote/retry"
)

const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// layerTar writes the tree under root as a tar: entries sorted by path,
// times fixed at epoch, owned by root (the image's user comes from its
// config), modes as on disk.
func layerTar(root string, epoch time.Time) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != root {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, path := range paths {
		info, err := os.Lstat(path)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return nil, err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return nil, err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil, err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.Format = tar.FormatPAX
		hdr.PAXRecords = nil
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gzipped compresses with no name and no time in the header, so the same
// input always gives the same bytes.
func gzipped(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeBlob(layout string, b []byte) (descriptor, error) {
	d := digestOf(b)
	path := filepath.Join(layout, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return descriptor{}, err
	}
	return descriptor{Digest: d, Size: int64(len(b))}, os.WriteFile(path, b, 0o644)
}

func jsonArray(flagName, v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	if err := json.Unmarshal([]byte(v), &out); err != nil {
		return nil, fmt.Errorf("-%s: not a JSON array of strings: %v", flagName, err)
	}
	return out, nil
}

func imageCmd(args []string) error {
	fl := flag.NewFlagSet("image", flag.ContinueOnError)
	root := fl.String("root", "", "the image's file system")
	out := fl.String("out", "", "the OCI image layout directory to write (emptied first)")
	tag := fl.String("tag", "", "the tag (index.json's ref.name)")
	entrypoint := fl.String("entrypoint", "", "entrypoint, a JSON array")
	cmd := fl.String("cmd", "", "command, a JSON array")
	user := fl.String("user", "", "user[:group]")
	expose := fl.String("expose", "", "ports, e.g. 8443/tcp,8081/tcp")
	epochSecs := fl.Int64("epoch", 0, "the time of every file and of the image (SOURCE_DATE_EPOCH)")
	arch := fl.String("arch", "amd64", "the image's architecture (amd64, arm64)")
	var labels multiFlag
	fl.Var(&labels, "label", "a label key=value (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *root == "" || *out == "" || *tag == "" {
		return fmt.Errorf("-root, -out and -tag are required")
	}
	epoch := time.Unix(*epochSecs, 0).UTC()
	ep, err := jsonArray("entrypoint", *entrypoint)
	if err != nil {
		return err
	}
	cm, err := jsonArray("cmd", *cmd)
	if err != nil {
		return err
	}
	layer, err := layerTar(*root, epoch)
	if err != nil {
		return err
	}
	zipped, err := gzipped(layer)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	layerDesc, err := writeBlob(*out, zipped)
	if err != nil {
		return err
	}
	layerDesc.MediaType = mediaLayer
	ports := map[string]struct{}{}
	for _, p := range strings.Split(*expose, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			ports[p] = struct{}{}
		}
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: want key=value", l)
		}
		labelMap[k] = v
	}
	config := map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": *arch,
		"os":           "linux",
		"config": map[string]any{
			"User":         *user,
			"Entrypoint":   ep,
			"Cmd":          cm,
			"ExposedPorts": ports,
			"Env":          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Labels":       labelMap,
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{digestOf(layer)},
		},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "kms-release image"}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	configDesc, err := writeBlob(*out, configJSON)
	if err != nil {
		return err
	}
	configDesc.MediaType = mediaConfig
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
		"annotations":   labelMap,
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	manifestDesc, err := writeBlob(*out, manifestJSON)
	if err != nil {
		return err
	}
	manifestDesc.MediaType = mediaManifest
	manifestDesc.Annotations = map[string]string{"org.opencontainers.image.ref.name": *tag}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{manifestDesc},
	}
	indexJSON, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "index.json"), indexJSON, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return err
	}
	fmt.Println(manifestDesc.Digest)
	return nil
}

// layoutDigest is the digest of the single manifest of a layout's index.
func layoutDigest(layout string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return "", err
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		return "", err
	}
	if len(index.Manifests) != 1 {
		return "", fmt.Errorf("%s: %d manifests in index.json, want 1", layout, len(index.Manifests))
	}
	return index.Manifests[0].Digest, nil
}

func digestCmd(args []string) error {
	fl := flag.NewFlagSet("digest", flag.ContinueOnError)
	layout := fl.String("layout", "", "the OCI image layout")
	if err := fl.Parse(args); err != nil {
		return err
	}
	d, err := layoutDigest(*layout)
	if err != nil {
		return err
	}
	fmt.Println(d)
	return nil
}

// isLoopback says whether a registry host is on this machine, where plain
// HTTP is used without further flags.
func isLoopback(host string) bool {
	h := host
	if i := strings.LastIndex(h, ":"); i > 0 && !strings.HasSuffix(h, "]") {
		h = h[:i]
	}
	return h == "localhost" || h == "127.0.0.1" || h == "[::1]" || strings.HasPrefix(h, "127.")
}

func pushCmd(args []string) error {
	fl := flag.NewFlagSet("push", flag.ContinueOnError)
	layout := fl.String("layout", "", "the OCI image layout")
	tag := fl.String("tag", "", "the tag in the layout")
	to := fl.String("to", "", "REGISTRY/REPOSITORY[:TAG] (default tag: -tag)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *layout == "" || *tag == "" || *to == "" {
		return fmt.Errorf("-layout, -tag and -to are required")
	}
	ref, dstTag := *to, *tag
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref, dstTag = ref[:i], ref[i+1:]
	}
	ctx := context.Background()
	store, err := oci.NewWithContext(ctx, *layout)
	if err != nil {
		return err
	}
	repo, err := remote.NewRepository(ref)
	if err != nil {
		return err
	}
	host := repo.Reference.Registry
	repo.PlainHTTP = isLoopback(host)
	if !repo.PlainHTTP {
		creds, err := credentials.NewStoreFromDocker(credentials.StoreOptions{})
		if err != nil {
			return err
		}
		repo.Client = &auth.Client{
			Client:     retry.DefaultClient,
			Cache:      auth.NewCache(),
			Credential: credentials.Credential(creds),
		}
	}
	desc, err := oras.Copy(ctx, store, *tag, repo, dstTag, oras.DefaultCopyOptions)
	if err != nil {
		return err
	}
	fmt.Printf("%s:%s@%s\n", ref, dstTag, desc.Digest)
	return nil
}
