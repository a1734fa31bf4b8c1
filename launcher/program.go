package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	gompipgo "github.com/gompi-org/gompi/pgo"
)

// program is the executable the ranks run.
type program struct {
	path   string // absolute path of the executable
	tmpDir string // the build directory to remove, or ""
}

func (p *program) cleanup() {
	if p.tmpDir != "" {
		os.RemoveAll(p.tmpDir)
	}
}

// resolveProgram finds or builds the executable named by name:
//   - an existing directory, or a file ending in .go: built with go build;
//   - an existing executable file: used as is;
//   - a name without a slash: looked up in PATH;
//   - any other relative name with a slash that is not on disk (such as
//     github.com/x/y/cmd/z): built as a Go package path from the current
//     directory's module.
//
// A built binary goes into a new temporary directory that cleanup removes.
func resolveProgram(ctx context.Context, name, pgo string) (*program, error) {
	if name == "" {
		return nil, argErrorf("no program given")
	}
	if fi, err := os.Stat(name); err == nil {
		switch {
		case fi.IsDir():
			return buildProgram(ctx, name, ".", pgo)
		case strings.HasSuffix(name, ".go") && fi.Mode().IsRegular():
			abs, err := filepath.Abs(name)
			if err != nil {
				return nil, err
			}
			return buildProgram(ctx, filepath.Dir(abs), filepath.Base(abs), pgo)
		case !fi.Mode().IsRegular():
			return nil, argErrorf("program %q is not a regular file", name)
		case fi.Mode().Perm()&0o111 == 0:
			return nil, argErrorf("program %q is not executable", name)
		}
		abs, err := filepath.Abs(name)
		if err != nil {
			return nil, err
		}
		return &program{path: abs}, nil
	}
	if !strings.Contains(name, "/") {
		path, err := exec.LookPath(name)
		if err != nil {
			return nil, argErrorf("program %q not found: no such file, and no such command in PATH", name)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, err
		}
		return &program{path: abs}, nil
	}
	if filepath.IsAbs(name) || name == "." || name == ".." ||
		strings.HasPrefix(name, "./") || strings.HasPrefix(name, "../") {
		return nil, argErrorf("program %q not found: no such file or directory", name)
	}
	return buildProgram(ctx, "", name, pgo)
}

// buildProgram runs go build on pkg (a package path, "." or a .go file) in
// directory dir ("" for the current one) into a new temporary directory,
// with the profile pgo names (Config.PGO).
func buildProgram(ctx context.Context, dir, pkg, pgo string) (*program, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("building %s needs the go command: %w", describe(dir, pkg), err)
	}
	tmp, err := os.MkdirTemp("", "gorun-")
	if err != nil {
		return nil, err
	}
	p := &program{path: filepath.Join(tmp, "prog"), tmpDir: tmp}
	flag, err := pgoFlag(pgo, dir, tmp)
	if err != nil {
		p.cleanup()
		return nil, err
	}
	cmd := exec.CommandContext(ctx, goCmd, "build", flag, "-o", p.path, pkg)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		p.cleanup()
		msg := strings.TrimSpace(out.String())
		if msg == "" {
			msg = err.Error()
		}
		if ctx.Err() != nil {
			msg = ctx.Err().Error()
		}
		return nil, argErrorf("go build %s failed:\n%s", describe(dir, pkg), msg)
	}
	// For a package that is not main, go build -o writes an archive, not a
	// program.
	if fi, err := os.Stat(p.path); err != nil || fi.Mode().Perm()&0o111 == 0 {
		p.cleanup()
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil, argErrorf("%s is not a main package: go build made no program", describe(dir, pkg))
		}
		return nil, err
	}
	return p, nil
}

// pgoFlag returns go build's -pgo flag for Config.PGO value pgo, writing
// gompi's profile into tmp when it is the one. dir is the program's
// folder, "" when it is named by package path (then gompi's profile is
// used even if the package has a default.pgo: say "auto" for that one).
func pgoFlag(pgo, dir, tmp string) (string, error) {
	switch pgo {
	case "":
		if dir != "" {
			if _, err := os.Stat(filepath.Join(dir, "default.pgo")); err == nil {
				return "-pgo=auto", nil
			}
		}
		f := filepath.Join(tmp, "gompi.pgo")
		if err := os.WriteFile(f, gompipgo.Profile, 0o600); err != nil {
			return "", err
		}
		return "-pgo=" + f, nil
	case "auto", "off":
		return "-pgo=" + pgo, nil
	}
	abs, err := filepath.Abs(pgo)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(abs); err != nil || !fi.Mode().IsRegular() {
		return "", argErrorf("--pgo %s: not a profile file (want a file, auto or off)", pgo)
	}
	return "-pgo=" + abs, nil
}

func describe(dir, pkg string) string {
	if dir == "" {
		return pkg
	}
	if pkg == "." {
		return dir
	}
	return filepath.Join(dir, pkg)
}
