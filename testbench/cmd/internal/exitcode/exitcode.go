// Package exitcode is the test bench commands' one rule for turning run's error into an
// exit status.
package exitcode

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Of is the exit status of command name for run's error, which it prints on stderr as
// "name: error" (an error already naming the command is not named twice): 0 for none
// and for -h/--help (the usage is printed already), fail otherwise.
func Of(name string, err error, stderr io.Writer, fail int) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintln(stderr, name+":", strings.TrimPrefix(err.Error(), name+": "))
		return fail
	}
}
