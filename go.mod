module github.com/kvrouter/kvrouter

go 1.26.8

require (
	github.com/hashicorp/golang-lru/v2 v2.0.7
	golang.org/x/text v0.42.0
)
