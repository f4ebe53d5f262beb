module orchard.dev/e2e/tools/luahealth

go 1.26.0

require github.com/yuin/gopher-lua v1.1.2
