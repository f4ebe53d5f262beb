// luahealth: runs an Argo CD custom health check (resource.customizations.health.<group_kind>) the way
// Argo CD's controller does (argo-cd util/lua/lua.go, runLua + ExecuteHealthLua): gopher-lua with the
// standard libraries skipped except package, base and table (no string, math or io library: a script
// that calls string.find fails here as it would in Argo CD), a 1 s deadline, the object as the global
// `obj` (maps -> tables, lists -> array tables, numbers -> Lua numbers), and the returned table read as
// {status, message}; a status that is not one of Argo CD's health codes becomes Unknown, as in Argo CD.
//
// Usage: luahealth SCRIPT.lua OBJECT.json  ->  one JSON line {"status": "...", "message": "..."}
// Exit 1 when the script fails or does not return a table (Argo CD reports an error for that object).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
)

var healthCodes = map[string]bool{
	"Unknown": true, "Progressing": true, "Healthy": true, "Suspended": true, "Degraded": true, "Missing": true,
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: luahealth SCRIPT.lua OBJECT.json")
		os.Exit(2)
	}
	status, message, err := run(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "luahealth:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]string{"status": status, "message": message})
}

func run(scriptPath, objPath string) (string, string, error) {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return "", "", err
	}
	data, err := os.ReadFile(objPath)
	if err != nil {
		return "", "", err
	}
	var obj map[string]interface{}
	if err := json.Unmarshal(data, &obj); err != nil {
		return "", "", fmt.Errorf("%s: %w", objPath, err)
	}

	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, pair := range []struct {
		n string
		f lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(pair.f), NRet: 0, Protect: true}, lua.LString(pair.n)); err != nil {
			return "", "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, obj))
	if err := l.DoString(string(script)); err != nil {
		return "", "", err
	}
	ret := l.Get(-1)
	table, ok := ret.(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, expected a table", ret.Type().String())
	}
	status := stringField(table, "status")
	message := stringField(table, "message")
	if !healthCodes[status] {
		return "Unknown", "The check returned an invalid health status", nil
	}
	return status, message, nil
}

func stringField(t *lua.LTable, key string) string {
	if s, ok := t.RawGetString(key).(lua.LString); ok {
		return string(s)
	}
	return ""
}

// decodeValue is Argo CD's conversion of an unstructured object into Lua values.
func decodeValue(l *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case float64:
		return lua.LNumber(v)
	case []interface{}:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]interface{}:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}
