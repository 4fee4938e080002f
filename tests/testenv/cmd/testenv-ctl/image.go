package main

// Container images without a registry or an image tool: a directory tree
// becomes one layer, and the layer, a config and a manifest become a
// tarball in the layout `docker save` writes, which `ctr images import`
// (and `docker load`) accept.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// imageSpec is what the image declares.
type imageSpec struct {
	Root       string   // the directory that becomes the image's filesystem
	Tag        string   // e.g. localhost/kms-operator:dev
	Entrypoint []string // exec form
	Cmd        []string
	User       string
	Expose     []string // e.g. 8443/tcp
	Env        []string
	Out        string // the tarball to write
}

// layerTar writes the tree under root as a tar with fixed times and owners
// (root, or the numeric owner of the file when uid/gid are given in names:
// files are stored as root-owned; the image's user comes from its config).
func layerTar(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
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
	epoch := time.Unix(0, 0)
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
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, epoch, epoch
		hdr.Format = tar.FormatPAX
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

// buildImage writes the tarball of spec.
func buildImage(spec imageSpec) error {
	if !strings.Contains(spec.Tag, ":") {
		return fmt.Errorf("the tag %q needs a version (name:tag)", spec.Tag)
	}
	layer, err := layerTar(spec.Root)
	if err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer)
	diffID := "sha256:" + hex.EncodeToString(layerSum[:])
	exposed := map[string]struct{}{}
	for _, p := range spec.Expose {
		if !strings.Contains(p, "/") {
			p += "/tcp"
		}
		exposed[p] = struct{}{}
	}
	config := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      "1970-01-01T00:00:00Z",
		"config": map[string]any{
			"Entrypoint":   spec.Entrypoint,
			"Cmd":          spec.Cmd,
			"User":         spec.User,
			"ExposedPorts": exposed,
			"Env":          spec.Env,
			"WorkingDir":   "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(configJSON)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	layerName := hex.EncodeToString(layerSum[:]) + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{spec.Tag},
		"Layers":   []string{layerName},
	}})
	if err != nil {
		return err
	}
	out, err := os.Create(spec.Out + ".tmp")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	add := func(name string, data []byte) error {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{configName, configJSON}, {layerName, layer}, {"manifest.json", manifest}} {
		if err := add(f.name, f.data); err != nil {
			out.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(spec.Out+".tmp", spec.Out)
}

// jsonList parses a JSON array of strings, or a comma list.
func jsonList(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if strings.HasPrefix(s, "[") {
		var out []string
		err := json.Unmarshal([]byte(s), &out)
		return out, err
	}
	return strings.Split(s, ","), nil
}
