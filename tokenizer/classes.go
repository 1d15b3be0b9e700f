package tokenizer

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// runeRange is an inclusive range of code points in a generated table.
type runeRange struct{ lo, hi rune }

// unicodeTables holds the generated character-class tables (testdata/gen/unicodetables.mjs):
// a table's name on a line of its own, then one "LO HI" hex range a line.
//
//go:embed unicode_tables.txt
var unicodeTables []byte

// parseRangeTables reads unicodeTables' format into named range lists.
func parseRangeTables(data []byte) (map[string][]runeRange, error) {
	out := map[string][]runeRange{}
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		lo, hi, ok := strings.Cut(line, " ")
		if !ok {
			cur = line
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 32)
		b, err2 := strconv.ParseUint(hi, 16, 32)
		if err1 != nil || err2 != nil || cur == "" || a > b || b >= 0x110000 {
			return nil, fmt.Errorf("tokenizer: unicode_tables.txt:%d: bad range %q", n, line)
		}
		out[cur] = append(out[cur], runeRange{rune(a), rune(b)})
	}
	return out, sc.Err()
}

// Character classes of the pre-tokenizer regexes, as Oniguruma with Unicode 16.0
// defines them.
const (
	clsLetter = 1 << iota // \p{L}
	clsNumber             // \p{N}
	clsSpace              // \s (White_Space)
	clsNew9               // unassigned in Unicode 9.0 (inert for HF's NFC)
)

// classTable is a two-level lookup: classIdx picks a 256-rune block, classBlocks holds
// the deduplicated blocks. Built once on first use from the generated range tables.
var (
	classOnce   sync.Once
	classIdx    [0x110000 >> 8]uint16
	classBlocks []uint8
)

func buildClasses() {
	tables, err := parseRangeTables(unicodeTables)
	if err != nil {
		panic(err) // generated and embedded: TestUnicodeTablesParse guards the file
	}
	flat := make([]uint8, 0x110000)
	for _, t := range []struct {
		name string
		bit  uint8
	}{{"letter16", clsLetter}, {"number16", clsNumber}, {"space16", clsSpace}, {"unassigned9", clsNew9}} {
		for _, r := range tables[t.name] {
			for c := r.lo; c <= r.hi; c++ {
				flat[c] |= t.bit
			}
		}
	}
	seen := map[string]uint16{}
	for b := 0; b < len(classIdx); b++ {
		blk := flat[b<<8 : (b+1)<<8]
		if i, ok := seen[string(blk)]; ok {
			classIdx[b] = i
			continue
		}
		i := uint16(len(classBlocks) >> 8)
		classBlocks = append(classBlocks, blk...)
		seen[string(blk)] = i
		classIdx[b] = i
	}
}

// classOf returns the class bits of r. classOnce must have run.
func classOf(r rune) uint8 {
	if uint32(r) >= 0x110000 {
		return 0
	}
	return classBlocks[int(classIdx[r>>8])<<8|int(r&0xff)]
}
