-- warmbox.errors: the one option checker and the one table of error codes.
local errors = require "warmbox.errors"

local function root()
  local src = debug.getinfo(1, "S").source:sub(2)
  return (src:match("^(.*)/spec/unit/[^/]+$") or ".")
end

local function files(dir, ext)
  local out = {}
  local p = assert(io.popen(("find %q -name '*.%s' -type f | sort"):format(root() .. "/" .. dir, ext)))
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  assert(#out > 0, "no ." .. ext .. " file under " .. dir)
  return out
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Upper-case literals in lua/ that are not error codes, and why.
local NOT_CODES = {
  GET = "HTTP method", POST = "HTTP method", DELETE = "HTTP method", HEAD = "HTTP method",
  EVAL = "Redis command", BLPOP = "Redis command", DEL = "Redis command", ASKING = "Redis command",
  SENTINEL = "Redis command", CLUSTER = "Redis command", ROLE = "Redis command", PING = "Redis command",
  SET = "Redis command", INFO = "Redis command", CONFIG = "Redis command", MASTER = "Redis command",
  REPLICAS = "Redis command", SLOTS = "Redis command", PX = "Redis command", MOVED = "Redis redirection",
  ASK = "Redis redirection",
  WARMBOX_REDIS_USERNAME = "environment variable", WARMBOX_REDIS_PASSWORD = "environment variable",
  SESSION = "CLI column header", TENANT = "CLI column header", AGE = "CLI column header",
  SANDBOX = "CLI column header", STATE = "CLI column header", KEY = "CLI column header",
  SANDBOXES = "CLI column header",
  FILE_TYPE_DIRECTORY = "envd file type", FILE_TYPE_SYMLINK = "envd file type",
  WARMBOXD_BIN = "environment variable", WARMBOX_LOCK = "environment variable",
  WARMBOX_REDIS_URL = "environment variable", NO_COLOR = "environment variable", HOME = "environment variable",
  XDG_RUNTIME_DIR = "environment variable", XDG_STATE_HOME = "environment variable",
  WARMBOX_SERVER_IDLE_EXIT = "environment variable", WARMBOX_PYTHON = "environment variable",
  FAIL = "doctor check status",
  FAILED = "smoke step status", ERROR = "simulator report: a run raised", GC = "simulator report: a GC pass raised",
}

describe("warmbox.errors", function()
  describe(".codes", function()
    it("holds every code that lua/ returns or compares", function()
      local seen = {}
      for _, path in ipairs(files("lua", "lua")) do
        local n = 0
        for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
          n = n + 1
          local code_part = line:gsub("%-%-.*$", "") -- comments document codes; they return none
          for lit in code_part:gmatch('"([A-Z][A-Z_]+)"') do
            if not NOT_CODES[lit] then seen[lit] = seen[lit] or (path:match("lua/.*$") .. ":" .. n) end
          end
        end
      end
      assert.truthy(seen.BUSY and seen.LOCK and seen.SANDBOX_GONE, "the scan found no codes")
      for code, where in pairs(seen) do
        assert.is_string(errors.codes[code], code .. " (" .. where .. ") is not in warmbox.errors.codes")
      end
    end)

    it("holds every code that csrc/core returns", function()
      local seen = {}
      for _, path in ipairs(files("csrc/core", "c")) do
        local src = read(path)
        for lit in src:gmatch('lua_pushliteral%(L, "([A-Z][A-Z_]+)"%)') do seen[lit] = path end
        for lit in src:gmatch('push_error%(L, [^;]-"([A-Z][A-Z_]+)"%)') do seen[lit] = path end
        for lit in src:gmatch('%? "([A-Z][A-Z_]+)" : "([A-Z][A-Z_]+)"') do seen[lit] = path end
      end
      assert.truthy(seen.IO and seen.REDIS and seen.TRANSPORT and seen.ABORTED and seen.TIMEOUT,
        "the scan found no codes")
      for code, where in pairs(seen) do
        assert.is_string(errors.codes[code], code .. " (" .. where .. ") is not in warmbox.errors.codes")
      end
    end)

    it("is referenced, not copied, by README and HACKING", function()
      for _, doc in ipairs({ "README.md", "HACKING.md" }) do
        local s = read(root() .. "/" .. doc)
        assert.truthy(s:find("warmbox.errors.codes", 1, true), doc .. " does not point at warmbox.errors.codes")
        assert.falsy(s:find("| `BUSY` |", 1, true), doc .. " copies the code table")
      end
    end)

    it("maps HTTP statuses to codes in the table", function()
      for _, st in ipairs({ 400, 401, 403, 404, 409, 422, 429, 500, 502 }) do
        assert.is_string(errors.codes[errors.code_for_status(st, true)])
        assert.is_string(errors.codes[errors.code_for_status(st, false)])
      end
      assert.equal("SANDBOX_GONE", errors.code_for_status(502, true))
      assert.equal("HTTP", errors.code_for_status(502, false))
    end)
  end)

  describe(".check_options", function()
    local spec = { name = "string", n = "number", i = "integer", f = "function", m = "map",
      either = "string|false", any = true }

    it("returns the table, or a new empty one for nil", function()
      local t = { name = "x", any = {} }
      assert.equal(t, errors.check_options(t, spec, "f", 1))
      assert.same({}, errors.check_options(nil, spec, "f", 1))
    end)

    it("raises in lauxlib's words", function()
      local function f(o) return errors.check_options(o, spec, "f", 2) end
      assert.has_error(function() f(3) end, "bad argument #2 to 'f' (table expected, got number)")
      assert.has_error(function() f{ nope = 1 } end, "bad argument #2 to 'f' (unknown option 'nope')")
      assert.has_error(function() f{ name = 1 } end,
        "bad argument #2 to 'f' (option 'name': string expected, got number)")
      assert.has_error(function() f{ i = 1.5 } end, "bad argument #2 to 'f' (option 'i': integer expected, got number)")
      assert.has_error(function() f{ m = { a = 1 } } end,
        "bad argument #2 to 'f' (option 'm': a table of strings to strings expected)")
      assert.has_error(function() f{ m = "x" } end, "bad argument #2 to 'f' (option 'm': table expected, got string)")
      assert.has_error(function() f{ either = true } end,
        "bad argument #2 to 'f' (option 'either': string or false expected, got boolean)")
      f{ either = false, m = { a = "b" }, i = 3, any = print, f = print, n = 1.5 }
    end)

    it("accepts a list of names, and prefixes nested option names", function()
      assert.has_error(function() errors.check_options({ b = 1 }, { "a" }, "g", 1) end,
        "bad argument #1 to 'g' (unknown option 'b')")
      assert.has_error(function() errors.check_options({ b = 1 }, { a = true }, "g", 1, 2, "retry.") end,
        "bad argument #1 to 'g' (unknown option 'retry.b')")
    end)

    it("blames the caller of the checking function", function()
      local function api(o) errors.check_options(o, spec, "api", 1) end
      local ok, err = pcall(function() api{ nope = 1 } end) -- this line is the caller
      assert.is_false(ok)
      assert.matches("errors_spec%.lua:%d+: bad argument #1 to 'api'", err)
      local line = debug.getinfo(1, "l").currentline - 3
      assert.truthy(err:find(":" .. line .. ":", 1, true), err)
    end)
  end)
end)

describe("errors.reraise_interrupt", function()
  it("raises lua.c's ^C again, bare, positioned or with a traceback, and passes other errors back", function()
    for _, e in ipairs{ "interrupted!", "?: interrupted!", "interrupted!\nstack traceback:\n\t[C]: in ?" } do
      assert.has_error(function() errors.reraise_interrupt(e) end, "interrupted!")
    end
    assert.equal("boom: not interrupted! at all", errors.reraise_interrupt("boom: not interrupted! at all"))
    assert.equal(42, errors.reraise_interrupt(42))
  end)

  it("keeps json.decode from turning an interrupt under cjson.safe's pcall into a decode error", function()
    local json = require "warmbox.json"
    -- lua.c's way: a call hook raises at a call; here the call cjson.safe's
    -- decode makes under its own pcall (the second C call json.decode makes
    -- that is not one of these).
    local skip = { [pcall] = true, [type] = true, [tostring] = true, [debug.sethook] = true }
    local n = 0
    debug.sethook(function()
      local f = debug.getinfo(2, "fS")
      if f and f.what == "C" and not skip[f.func] then
        n = n + 1
        if n == 2 then
          debug.sethook()
          error("interrupted!")
        end
      end
    end, "c")
    local ok, err = pcall(json.decode, "[1, 2]")
    debug.sethook()
    assert.equal(2, n)
    assert.is_false(ok)
    assert.matches("interrupted!$", tostring(err))
  end)
end)
