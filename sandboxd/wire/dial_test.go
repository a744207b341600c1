package wire

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDial: the gateway side reads exactly the identity Dial was given,
// then the bytes the caller writes; a bad identity or a missing socket
// fails before anything is sent.
func TestDial(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "gw.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type got struct {
		id   Identity
		rest string
		err  error
	}
	ch := make(chan got, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			ch <- got{err: err}
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		id, err := Read(br)
		rest, _ := br.ReadString('\n')
		ch <- got{id, rest, err}
	}()
	want := Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock, want)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.1\n")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	g := <-ch
	if g.err != nil || g.id != want || g.rest != "GET / HTTP/1.1\n" {
		t.Fatalf("gateway read %+v, rest %q, err %v; want %+v then the request", g.id, g.rest, g.err, want)
	}

	for _, tc := range []struct {
		name string
		path string
		id   Identity
		want error // nil: any error
	}{
		{"identity without an agent", sock, Identity{Sandbox: "sb-1"}, nil},
		{"no socket", filepath.Join(t.TempDir(), "none.sock"), want, syscall.ENOENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(ctx, tc.path, tc.id)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
