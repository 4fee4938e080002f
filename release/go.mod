module kms-operator.invalid/release

go 1.26.0

require oras.land/oras-go/v2 v2.7.0

require (
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.24.0 // indirect
)
