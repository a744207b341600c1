package egress

import (
	"io"
	"net/http"
)

// interceptStreams is how many requests an intercepted tunnel that speaks
// HTTP/2 may have in flight at once. Over HTTP/1.1 a tunnel carries one at
// a time; this keeps one tunnel from fanning out to many upstream
// requests (egress.max_tunnels_per_caller bounds the tunnels).
const interceptStreams = 16

// copyResponse copies an upstream's body to w and returns how many bytes
// it wrote. A body of unknown length (a stream: server-sent events, a
// long poll, chunked progress) is flushed after every read, so the
// sandbox gets each piece when the upstream sends it rather than when
// w's buffer fills; a body of known length is left to w's buffering.
func copyResponse(w http.ResponseWriter, body io.Reader, stream bool) int64 {
	if !stream {
		n, _ := io.Copy(w, body)
		return n
	}
	return flushEach(w, body, make([]byte, 32<<10))
}

// flushEach copies body to w through buf, flushing w after every read,
// and returns how many bytes it wrote.
func flushEach(w http.ResponseWriter, body io.Reader, buf []byte) int64 {
	rc := http.NewResponseController(w)
	var total int64
	for {
		k, err := body.Read(buf)
		if k > 0 {
			m, werr := w.Write(buf[:k])
			total += int64(m)
			if werr != nil || rc.Flush() != nil {
				return total
			}
		}
		if err != nil {
			return total
		}
	}
}
