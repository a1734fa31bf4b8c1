package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func TestParseArgs(t *testing.T) {
	env := lookup(map[string]string{"HOME": "/home/me"})
	cfg, help, err := parseArgs([]string{
		"-np", "4", "--tag-output", "--timeout", "1m30s", "-x", "A=1", "-x", "HOME",
		"--param", "z=first", "--eager-limit", "4k", "--btl", "^tcp", "--max-send-size", "1m",
		"--protocol", "eager", "--send-pipeline-depth", "3", "--param", "a=last=with=equals",
		"--stats", "--verbose", "--oversubscribe", "--grace", "5s", "--pgo", "off",
		"./prog", "-np", "7", "--verbose", "arg",
	}, env)
	if err != nil || help {
		t.Fatal(err, help)
	}
	if cfg.NP != 4 || cfg.Program != "./prog" || !reflect.DeepEqual(cfg.Args, []string{"-np", "7", "--verbose", "arg"}) {
		t.Errorf("np %d program %q args %q", cfg.NP, cfg.Program, cfg.Args)
	}
	if !cfg.TagOutput || !cfg.Stats || !cfg.Verbose || !cfg.Oversubscribe || cfg.Timeout != 90*time.Second || cfg.Grace != 5*time.Second || cfg.PGO != "off" {
		t.Errorf("options: %+v", cfg)
	}
	if !reflect.DeepEqual(cfg.Env, []string{"A=1", "HOME=/home/me"}) {
		t.Errorf("env %q", cfg.Env)
	}
	want := [][2]string{
		{"z", "first"},
		{"btl_self_eager_limit", "4k"}, {"btl_sm_eager_limit", "4k"}, {"btl_tcp_eager_limit", "4k"}, {"btl_verbs_eager_limit", "4k"},
		{"btl", "^tcp"},
		{"btl_self_max_send_size", "1m"}, {"btl_sm_max_send_size", "1m"}, {"btl_tcp_max_send_size", "1m"}, {"btl_verbs_max_send_size", "1m"},
		{"pml_force_protocol", "eager"},
		{"pml_send_pipeline_depth", "3"},
		{"a", "last=with=equals"},
	}
	if !reflect.DeepEqual(cfg.Params, want) {
		t.Errorf("params\n got %q\nwant %q", cfg.Params, want)
	}
}

func TestParseArgsSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"-np", "3", "prog"},
		{"-np=3", "prog"},
		{"-n", "3", "prog"},
		{"-n3", "prog"},
		{"--np", "3", "prog"},
		{"--np=3", "prog"},
		{"--tag-output", "-np", "3", "prog"},
		{"-x", "A=-np", "-np", "3", "prog"},
		{"-xA=1", "-np", "3", "prog"},
		{"--timeout", "1s", "-np", "3", "--", "prog"},
	} {
		cfg, _, err := parseArgs(args, lookup(nil))
		if err != nil || cfg.NP != 3 || cfg.Program != "prog" {
			t.Errorf("%q: np %d program %q err %v", args, cfg.NP, cfg.Program, err)
		}
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing -np"},
		{[]string{"prog"}, "missing -np"},
		{[]string{"-np", "2"}, "missing PROGRAM"},
		{[]string{"-np", "0", "p"}, "at least 1"},
		{[]string{"-np", "x", "p"}, "invalid argument"},
		{[]string{"--nope", "-np", "1", "p"}, "unknown flag: --nope"},
		{[]string{"-np", "1", "--timeout", "-1s", "p"}, "negative"},
		{[]string{"-np", "1", "--param", "=v", "p"}, "not NAME=VALUE"},
		{[]string{"-np", "1", "--btl", "", "p"}, "empty value"},
		{[]string{"-np", "1", "-x", "UNSET_VAR", "p"}, "not set in gorun's environment"},
		{[]string{"-np", "1", "-x", "=v", "p"}, "not VAR or VAR=value"},
		{[]string{"-np", "1", "--pgo", "", "p"}, "--pgo: want a profile file, auto or off"},
	} {
		_, help, err := parseArgs(tc.args, lookup(nil))
		if help || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-np", "2", "--help", "prog"}} {
		if _, help, _ := parseArgs(args, lookup(nil)); !help {
			t.Errorf("%q: no help", args)
		}
	}
}

func TestRunUsageExitCodes(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--bogus"}, nil, &out, &errOut); code != exitUsage {
		t.Errorf("bad flag: exit %d", code)
	}
	if lines := strings.SplitN(errOut.String(), "\n", 2); lines[0] != "gorun: unknown flag: --bogus" || !strings.HasPrefix(lines[1], "usage:") {
		t.Errorf("stderr:\n%s", errOut.String())
	}
	out.Reset()
	if code := run([]string{"--help"}, nil, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "usage:") {
		t.Errorf("--help: exit %d, stdout %q", code, out.String())
	}
}

func TestParseLaunchFlags(t *testing.T) {
	noSlurm := lookup(map[string]string{})
	cfg, _, err := parseArgs([]string{"-np", "3", "--host", "a:2,b", "--launch-agent", "ip netns exec", "./prog"}, noSlurm)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Hosts) != 2 || cfg.Hosts[0].Name != "a" || cfg.Hosts[0].Slots != 2 || cfg.Hosts[1].Slots != 1 ||
		cfg.Agent != "ip netns exec" || cfg.Launch != "local" {
		t.Errorf("hosts %+v agent %q launch %q", cfg.Hosts, cfg.Agent, cfg.Launch)
	}
	cfg, _, err = parseArgs([]string{"-np", "1", "./prog"}, noSlurm)
	if err != nil || cfg.Launch != "local" || cfg.Agent != "ssh" {
		t.Errorf("default launch %q agent %q: %v", cfg.Launch, cfg.Agent, err)
	}
	cfg, _, err = parseArgs([]string{"-np", "1", "--launcher", "slurm", "./prog"}, noSlurm)
	if err != nil || cfg.Launch != "slurm" {
		t.Errorf("--launcher slurm: %q %v", cfg.Launch, err)
	}
	for _, bad := range [][]string{
		{"-np", "1", "--launcher", "pbs", "./prog"},
		{"-np", "1", "--host", "a:0", "./prog"},
		{"-np", "1", "--host", "a", "--hostfile", "/nonexistent", "./prog"},
		{"-np", "1", "--hostfile", "/nonexistent", "./prog"},
	} {
		if _, _, err := parseArgs(bad, noSlurm); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
