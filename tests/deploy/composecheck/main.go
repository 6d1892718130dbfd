// composecheck loads docker-compose.yml and Dockerfiles with the libraries Docker itself
// uses, so tests/deploy can check them on a machine without a Docker engine:
//
//	composecheck compose [-f FILE] [--project-directory DIR] [--env-file FILE]... [--profile NAME]...
//	    load, interpolate and validate the compose file as `docker compose config` does
//	    (compose-go v2: schema, interpolation from the environment and .env, profiles,
//	    depends_on references) and print the normalised project as JSON.
//	composecheck dockerfile FILE
//	    parse a Dockerfile with BuildKit's parser (frontend/dockerfile) and print its stages
//	    and instructions as JSON, with BuildKit's lint warnings.
//	composecheck ignored IGNOREFILE PATH...
//	    for each PATH (relative to the build context), whether a .dockerignore file excludes
//	    it, by the matcher BuildKit applies when it sends the context (moby/patternmatcher).
//
// Errors go to stderr with exit status 1; usage errors exit 2.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "compose":
		err = compose(os.Args[2:])
	case "dockerfile":
		if len(os.Args) != 3 {
			usage()
		}
		err = dockerfile(os.Args[2])
	case "ignored":
		if len(os.Args) < 4 {
			usage()
		}
		err = ignored(os.Args[2], os.Args[3:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "composecheck:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: composecheck compose [-f FILE] [--project-directory DIR] "+
		"[--env-file FILE]... [--profile NAME]...\n"+
		"       composecheck dockerfile FILE\n"+
		"       composecheck ignored IGNOREFILE PATH...")
	os.Exit(2)
}

func emit(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// compose mirrors the options `docker compose` builds its project with (OS environment,
// --env-file or the project directory's .env, profiles, paths resolved to absolute).
func compose(args []string) error {
	fs := flag.NewFlagSet("compose", flag.ExitOnError)
	file := fs.String("f", "docker-compose.yml", "compose file")
	dir := fs.String("project-directory", "", "project directory (default: the file's)")
	name := fs.String("p", "", "project name (default: from the file or directory)")
	var envFiles, profiles multi
	fs.Var(&envFiles, "env-file", "environment file (repeatable)")
	fs.Var(&profiles, "profile", "profile to enable (repeatable; * for all)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		usage()
	}
	wd := *dir
	if wd == "" {
		wd = filepath.Dir(*file)
	}
	opts := []cli.ProjectOptionsFn{
		cli.WithWorkingDirectory(wd),
		cli.WithOsEnv,
		cli.WithEnvFiles(envFiles...),
		cli.WithDotEnv,
		cli.WithProfiles(profiles),
		cli.WithResolvedPaths(true),
	}
	if *name != "" {
		opts = append(opts, cli.WithName(*name))
	}
	o, err := cli.NewProjectOptions([]string{*file}, opts...)
	if err != nil {
		return err
	}
	project, err := o.LoadProject(context.Background())
	if err != nil {
		return err
	}
	out, err := project.MarshalJSON()
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(out, '\n'))
	return err
}

type command struct {
	Instruction string            `json:"instruction"`
	Line        int               `json:"line"`
	From        string            `json:"from,omitempty"`
	Sources     []string          `json:"sources,omitempty"`
	Dest        string            `json:"dest,omitempty"`
	Chown       string            `json:"chown,omitempty"`
	Cmd         []string          `json:"cmd,omitempty"`
	Shell       bool              `json:"shell,omitempty"`
	Flags       []string          `json:"flags,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Value       string            `json:"value,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
}

type stage struct {
	Name     string    `json:"name"`
	Base     string    `json:"base"`
	Commands []command `json:"commands"`
}

type arg struct {
	Name    string  `json:"name"`
	Default *string `json:"default"`
}

func dockerfile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return err
	}
	warnings := []string{}
	for _, w := range res.Warnings {
		warnings = append(warnings, fmt.Sprintf("line %d: %s", w.Location.Start.Line, w.Short))
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		warnings = append(warnings, fmt.Sprintf("line %d: %s: %s", line, rule, msg))
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		return err
	}
	doc := struct {
		Args     []arg    `json:"args"`
		Stages   []stage  `json:"stages"`
		Warnings []string `json:"warnings"`
	}{Args: []arg{}, Stages: []stage{}, Warnings: warnings}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			doc.Args = append(doc.Args, arg{kv.Key, kv.Value})
		}
	}
	for _, s := range stages {
		st := stage{Name: s.Name, Base: s.BaseName, Commands: []command{}}
		for _, c := range s.Commands {
			st.Commands = append(st.Commands, describe(c))
		}
		doc.Stages = append(doc.Stages, st)
	}
	return emit(doc)
}

func describe(c instructions.Command) command {
	out := command{Instruction: strings.ToLower(c.Name())}
	if l, ok := c.(interface{ Location() []parser.Range }); ok && len(l.Location()) > 0 {
		out.Line = l.Location()[0].Start.Line
	}
	switch c := c.(type) {
	case *instructions.CopyCommand:
		out.From, out.Sources, out.Dest, out.Chown = c.From, c.SourcePaths, c.DestPath, c.Chown
	case *instructions.AddCommand:
		out.Sources, out.Dest, out.Chown = c.SourcePaths, c.DestPath, c.Chown
	case *instructions.RunCommand:
		out.Cmd, out.Shell, out.Flags = c.CmdLine, c.PrependShell, c.FlagsUsed
	case *instructions.CmdCommand:
		out.Cmd, out.Shell = c.CmdLine, c.PrependShell
	case *instructions.EntrypointCommand:
		out.Cmd, out.Shell = c.CmdLine, c.PrependShell
	case *instructions.HealthCheckCommand:
		out.Cmd = c.Health.Test
	case *instructions.EnvCommand:
		out.Env = map[string]string{}
		for _, kv := range c.Env {
			out.Env[kv.Key] = kv.Value
		}
	case *instructions.WorkdirCommand:
		out.Value = c.Path
	case *instructions.UserCommand:
		out.Value = c.User
	case *instructions.ExposeCommand:
		out.Ports = c.Ports
	case *instructions.ArgCommand:
		names := []string{}
		for _, kv := range c.Args {
			names = append(names, kv.Key)
		}
		out.Value = strings.Join(names, " ")
	}
	return out
}

func ignored(ignoreFile string, paths []string) error {
	f, err := os.Open(ignoreFile)
	if err != nil {
		return err
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return err
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return err
	}
	out := map[string]bool{}
	for _, p := range paths {
		rel := filepath.ToSlash(filepath.Clean(strings.TrimPrefix(p, "/")))
		excluded, err := pm.MatchesOrParentMatches(rel)
		if err != nil {
			return err
		}
		out[p] = excluded
	}
	return emit(out)
}
