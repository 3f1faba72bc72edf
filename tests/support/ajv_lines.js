// Validates JSON documents against one JSON Schema with ajv (Draft 2020-12, ajv-formats), a line
// at a time, so that one node process serves a whole test.
//
//   node ajv_lines.js NODE_MODULES_DIR
//
// The first line of stdin is the schema; every later line is a document, answered on stdout
// with one line: {"valid": true} or {"valid": false, "errors": ["/path: message", ...]}.
// A schema ajv cannot compile is answered {"schema_error": "..."} and the process exits 2.
"use strict";

const path = require("path");
const readline = require("readline");

const modules = path.resolve(process.argv[2]);
const load = (name) => require(path.join(modules, name));
const Ajv2020 = load("ajv/dist/2020").default;
const addFormats = load("ajv-formats").default;

// strict: an unknown keyword or format in the published schema is an error, not ignored. The
// lints stay off (strictTypes, strictTuples, strictRequired): the schema's if/then rules name
// properties without repeating their type, and its argv is an open tuple whose first item is
// the program, both as Draft 2020-12 allows.
const ajv = new Ajv2020({
  strict: true,
  strictTypes: false,
  strictTuples: false,
  strictRequired: false,
  allErrors: true,
});
addFormats(ajv);

let check = null;
const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on("line", (line) => {
  if (check === null) {
    try {
      check = ajv.compile(JSON.parse(line));
    } catch (error) {
      process.stdout.write(JSON.stringify({ schema_error: String(error.message || error) }) + "\n");
      process.exit(2);
    }
    process.stdout.write(JSON.stringify({ ready: true }) + "\n");
    return;
  }
  const valid = check(JSON.parse(line));
  const errors = valid ? [] : check.errors.map((e) => `${e.instancePath || "/"}: ${e.message}`);
  process.stdout.write(JSON.stringify({ valid, errors }) + "\n");
});
