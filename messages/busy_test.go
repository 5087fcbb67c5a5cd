package messages

import "testing"

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{
		{1, "1 byte"},
		{10, "10 bytes"},
		{1500, "1,500 bytes"},
		{1 << 10, "1 KiB"},
		{64 << 10, "64 KiB"},
		{1 << 20, "1 MiB"},
		{64 << 20, "64 MiB"},
		{1<<20 + 1, "1,048,577 bytes"},
	} {
		if got := FormatBytes(tc.n); got != tc.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestReplyTruncated(t *testing.T) {
	for _, tc := range []struct {
		max  int
		want string
	}{
		{10, "\n\n[… reply truncated at 10 characters]"},
		{100_000, "\n\n[… reply truncated at 100,000 characters]"},
		{10_000_000, "\n\n[… reply truncated at 10,000,000 characters]"},
	} {
		if got := ReplyTruncated(tc.max); got != tc.want {
			t.Errorf("ReplyTruncated(%d) = %q, want %q", tc.max, got, tc.want)
		}
	}
}
