package tokenizer

import "testing"

// TestUnicodeTablesParse guards the embedded, generated class tables: every table is there
// with its known range count, and a broken line is an error naming it.
func TestUnicodeTablesParse(t *testing.T) {
	tables, err := parseRangeTables(unicodeTables)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"letter16": 677, "number16": 144, "space16": 10, "unassigned9": 638}
	for name, n := range want {
		if got := len(tables[name]); got != n {
			t.Errorf("%s: %d ranges, want %d", name, got, n)
		}
	}
	if _, err := parseRangeTables([]byte("letter16\n0041 zz\n")); err == nil {
		t.Error("a bad range parsed")
	}
	if _, err := parseRangeTables([]byte("0041 005A\n")); err == nil {
		t.Error("a range before any table name parsed")
	}
}
