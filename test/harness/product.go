package harness

import (
	"context"
	"os/exec"
	"strings"
)

// productPaths are what the webhook is built from.
var productPaths = []string{"cmd", "pkg", "config", "go.mod", "go.sum"}

const dirtyMark = ", with uncommitted changes"

// ProductCommit is the last commit that changed what the webhook is built from, and that commit's
// date. Both carry a mark when those files have uncommitted changes, so that results measured on
// such a build never pass for the commit's (and parts of a run never merge across it).
func ProductCommit(root string) (commit, date string) {
	out, err := git(root, append([]string{"log", "-1", "--format=%H %cd", "--date=format:%Y-%m-%d %H:%M", "--"}, productPaths...)...)
	commit, date, ok := strings.Cut(out, " ")
	if err != nil || !ok {
		return "unknown", ""
	}
	if st, err := git(root, append([]string{"status", "--porcelain", "--"}, productPaths...)...); err != nil || st != "" {
		commit, date = commit+dirtyMark, date+dirtyMark
	}
	return commit, date
}

func git(root string, args ...string) (string, error) {
	cmd := exec.CommandContext(context.Background(), "git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// Uncommitted tells whether a commit ProductCommit returned carries the mark of uncommitted
// changes.
func Uncommitted(commit string) bool {
	return strings.HasSuffix(commit, dirtyMark)
}
