module github.com/gompi-org/gompi

go 1.26.0

require github.com/stretchr/testify v1.12.1

require (
	github.com/spf13/pflag v1.0.10 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
