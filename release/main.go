// kms-release: the pieces of a kms-operator release that no installed tool
// makes reproducibly or without a container engine.
//
//	kms-release image -root DIR -out LAYOUT -tag T [-entrypoint JSON] [-cmd JSON]
//	                  [-user U] [-expose P,...] [-label k=v ...] [-epoch SECONDS]
//	    an OCI image layout (oci-layout, index.json, blobs) of one gzip layer
//	    made from DIR: sorted entries, fixed times and owners, so the same
//	    tree always gives the same digest; prints the manifest digest.
//	kms-release push -layout LAYOUT -tag T -to REGISTRY/REPO[:TAG]
//	    copy the tagged image of LAYOUT to a registry (plain HTTP for a
//	    loopback registry; credentials of `docker login` otherwise).
//	kms-release digest -layout LAYOUT
//	    print the digest index.json holds.
//	kms-release sbom -metadata FILE -package NAME -out FILE [-epoch SECONDS]
//	    a CycloneDX 1.5 JSON SBOM of NAME's dependency tree, from
//	    `cargo metadata --format-version 1` output: every crate with its
//	    version and licence.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kms-release image|push|digest|sbom [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "image":
		err = imageCmd(os.Args[2:])
	case "push":
		err = pushCmd(os.Args[2:])
	case "digest":
		err = digestCmd(os.Args[2:])
	case "sbom":
		err = sbomCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kms-release %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
