package ws

import (
	"sort"
	"strings"
	"unicode/utf8"
)

// Emoji sequences use three kinds of characters that are invisible on
// their own: U+FE0F (emoji presentation) after a pictograph or a keycap
// base, U+200D (zero-width joiner) between two pictographs (👨‍👩‍👧), and
// the tag characters U+E0020–E007E ended by U+E007F after 🏴 (subdivision
// flags). firstInvisible allows exactly those places; anywhere else they
// could make two session keys look alike.

// firstInvisible returns the byte index of the first rune of key that is
// invisible (see invisible) outside an emoji sequence, or -1.
func firstInvisible(key string) int {
	var (
		prev  rune // the previous rune, -1 at the start
		emoji bool // prev ends a pictograph a ZWJ may follow (with its modifier or VS16)
	)
	prev = -1
	for i, r := range key {
		ok := !invisible(r)
		switch {
		case r == 0xFE0F:
			ok = pictographic(prev) || keycapBase(prev)
		case r == 0x200D:
			next, _ := utf8.DecodeRuneInString(key[i+utf8.RuneLen(r):])
			ok = emoji && pictographic(next)
		case isTag(r):
			ok = isTag(prev) || prev == blackFlag && tagRunEnds(key[i:])
		case r == cancelTag:
			ok = isTag(prev)
		}
		if !ok {
			return i
		}
		emoji = pictographic(r) || emoji && (emojiModifier(r) || r == 0xFE0F && pictographic(prev))
		prev = r
	}
	return -1
}

const (
	blackFlag = 0x1F3F4 // 🏴, the base of subdivision flags
	cancelTag = 0xE007F
)

func isTag(r rune) bool         { return r >= 0xE0020 && r <= 0xE007E }
func emojiModifier(r rune) bool { return r >= 0x1F3FB && r <= 0x1F3FF }
func keycapBase(r rune) bool    { return r == '#' || r == '*' || r >= '0' && r <= '9' }

// tagRunEnds reports whether s starts with tag characters ended by the
// cancel tag.
func tagRunEnds(s string) bool {
	rest := strings.TrimLeftFunc(s, isTag)
	return len(rest) < len(s) && strings.HasPrefix(rest, string(rune(cancelTag)))
}

// pictographic reports whether r is Extended_Pictographic (Unicode
// emoji-data.txt; the ranges include the blocks reserved for future emoji).
func pictographic(r rune) bool {
	if r < 0xA9 {
		return false
	}
	i := sort.Search(len(extPict), func(i int) bool { return extPict[i][1] >= r })
	return i < len(extPict) && extPict[i][0] <= r
}

// extPict are the Extended_Pictographic ranges, sorted.
var extPict = [][2]rune{
	{0x00A9, 0x00A9}, {0x00AE, 0x00AE}, {0x203C, 0x203C}, {0x2049, 0x2049}, {0x2122, 0x2122}, {0x2139, 0x2139},
	{0x2194, 0x2199}, {0x21A9, 0x21AA}, {0x231A, 0x231B}, {0x2328, 0x2328}, {0x2388, 0x2388}, {0x23CF, 0x23CF},
	{0x23E9, 0x23F3}, {0x23F8, 0x23FA}, {0x24C2, 0x24C2}, {0x25AA, 0x25AB}, {0x25B6, 0x25B6}, {0x25C0, 0x25C0},
	{0x25FB, 0x25FE}, {0x2600, 0x2605}, {0x2607, 0x2612}, {0x2614, 0x2685}, {0x2690, 0x2705}, {0x2708, 0x2712},
	{0x2714, 0x2714}, {0x2716, 0x2716}, {0x271D, 0x271D}, {0x2721, 0x2721}, {0x2728, 0x2728}, {0x2733, 0x2734},
	{0x2744, 0x2744}, {0x2747, 0x2747}, {0x274C, 0x274C}, {0x274E, 0x274E}, {0x2753, 0x2755}, {0x2757, 0x2757},
	{0x2763, 0x2767}, {0x2795, 0x2797}, {0x27A1, 0x27A1}, {0x27B0, 0x27B0}, {0x27BF, 0x27BF}, {0x2934, 0x2935},
	{0x2B05, 0x2B07}, {0x2B1B, 0x2B1C}, {0x2B50, 0x2B50}, {0x2B55, 0x2B55}, {0x3030, 0x3030}, {0x303D, 0x303D},
	{0x3297, 0x3297}, {0x3299, 0x3299},
	{0x1F000, 0x1F0FF}, {0x1F10D, 0x1F10F}, {0x1F12F, 0x1F12F}, {0x1F16C, 0x1F171}, {0x1F17E, 0x1F17F},
	{0x1F18E, 0x1F18E}, {0x1F191, 0x1F19A}, {0x1F1AD, 0x1F1E5}, {0x1F201, 0x1F20F}, {0x1F21A, 0x1F21A},
	{0x1F22F, 0x1F22F}, {0x1F232, 0x1F23A}, {0x1F23C, 0x1F23F}, {0x1F249, 0x1F3FA}, {0x1F400, 0x1F53D},
	{0x1F546, 0x1F64F}, {0x1F680, 0x1F6FF}, {0x1F774, 0x1F77F}, {0x1F7D5, 0x1F7FF}, {0x1F80C, 0x1F80F},
	{0x1F848, 0x1F84F}, {0x1F85A, 0x1F85F}, {0x1F888, 0x1F88F}, {0x1F8AE, 0x1F8FF}, {0x1F90C, 0x1F93A},
	{0x1F93C, 0x1F945}, {0x1F947, 0x1FAFF}, {0x1FC00, 0x1FFFD},
}
