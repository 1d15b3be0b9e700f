package demo

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// A child that exits after printing Go's bind error is recognised as having lost its
// port; any other exit is not.
func TestExitedRecognisesALostPort(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   bool
	}{
		{"bind failure", `echo "kvrouter: listen tcp 127.0.0.1:40000: bind: address already in use" >&2; exit 1`, true},
		{"other failure", `echo "kvrouter: config: unknown policy" >&2; exit 2`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &procStack{}
			if err := s.spawn("child", filepath.Join(t.TempDir(), "child.log"), nil, "/bin/sh", "-c", tc.script); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			select {
			case <-s.procs[0].done:
			case <-time.After(10 * time.Second):
				t.Fatal("child did not exit")
			}
			var ee *exitError
			if err := s.exited(); !errors.As(err, &ee) {
				t.Fatalf("exited() = %v, want an *exitError", err)
			}
			if ee.portTaken() != tc.want {
				t.Fatalf("portTaken() = %v, want %v (%v)", ee.portTaken(), tc.want, ee)
			}
		})
	}
}

type fakeStack struct{ closed bool }

func (f *fakeStack) Close() error { f.closed = true; return nil }

// startReady starts again, on a new stack, only when a child lost its port, and at most
// startTries times in all.
func TestStartReadyRetriesOnlyALostPort(t *testing.T) {
	lost := &exitError{name: "vllm-sim", tail: []byte("bind: address already in use")}
	other := &exitError{name: "kvrouter", tail: []byte("unknown policy")}
	for _, tc := range []struct {
		name       string
		readyErrs  []error // ready's answer for each started stack
		wantStarts int
		wantErr    error
	}{
		{"ready at once", []error{nil}, 1, nil},
		{"lost a port once", []error{lost, nil}, 2, nil},
		{"lost a port twice", []error{lost, lost, nil}, 3, nil},
		{"lost a port every time", []error{lost, lost, lost, nil}, startTries, lost},
		{"another exit is not retried", []error{other, nil}, 1, other},
		{"a timeout is not retried", []error{context.DeadlineExceeded, nil}, 1, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var started []*fakeStack
			st, err := startReady(context.Background(), func() (*fakeStack, error) {
				f := &fakeStack{}
				started = append(started, f)
				return f, nil
			}, func(f *fakeStack) error { return tc.readyErrs[len(started)-1] }, t.Logf)
			if !errors.Is(err, tc.wantErr) || len(started) != tc.wantStarts {
				t.Fatalf("err %v after %d starts, want %v after %d", err, len(started), tc.wantErr, tc.wantStarts)
			}
			for i, f := range started {
				if last := i == len(started)-1; f.closed == (last && err == nil) {
					t.Errorf("stack %d closed = %v", i, f.closed)
				}
			}
			if err == nil && st != started[len(started)-1] {
				t.Error("startReady did not return the ready stack")
			}
		})
	}
}
