package conv_test

import (
	"testing"

	"github.com/turnguard/turnguard/channels/conv"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		text, bot string
		want      conv.Command
		forOther  bool
	}{
		{"/stop", "", conv.Stop, false},
		{"  /stop  ", "", conv.Stop, false},
		{"\n/STOP\t", "", conv.Stop, false},
		{"/stop now please", "", conv.Stop, false},
		{"/status", "", conv.Status, false},
		{"/new", "", conv.New, false},
		{"/help", "", conv.Help, false},
		{"/start", "", conv.Help, false},
		{"/Stop@MyBot", "mybot", conv.Stop, false},
		{"/status@mybot extra", "MyBot", conv.Status, false},
		{"/stop@OtherBot", "mybot", conv.None, true},
		{"/steps@OtherBot web_search:1s", "mybot", conv.None, true},
		{"/steps web_search:1500ms web_search:1500ms", "", conv.None, false},
		{"/steps@mybot web_search:1s", "mybot", conv.None, false},
		{"/stopping", "", conv.None, false},
		{"/", "", conv.None, false},
		{"stop", "", conv.None, false},
		{"please /stop", "", conv.None, false},
		{"", "", conv.None, false},
	} {
		got, other := conv.Parse(tc.text, tc.bot)
		if got != tc.want || other != tc.forOther {
			t.Errorf("Parse(%q, %q) = %q, %v; want %q, %v", tc.text, tc.bot, got, other, tc.want, tc.forOther)
		}
	}
}
