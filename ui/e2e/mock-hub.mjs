// A local stand-in for the Hugging Face Hub for the browser end-to-end check (scripts/e2e-browser points
// `strata serve` at it with HF_ENDPOINT): the API subset Strata uses (search, a repository's tree, resolve
// with a redirect to a CDN path that serves ranges). One repository, strata-test/Tiny-GGUF: a real model
// (FILE, sent slowly enough for the progress bar to be seen), a file that is no GGUF (its plan fails), and
// the two parts of a split model.
//   node ui/e2e/mock-hub.mjs FILE      prints "mock hub: http://127.0.0.1:PORT" and serves until killed
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";

const REPO = "strata-test/Tiny-GGUF";

export function startMockHub(modelPath, { chunkBytes = 16 * 1024, chunkEveryMs = 50 } = {}) {
  const model = readFileSync(modelPath);
  const noise = Buffer.alloc(300 * 1024, 7);
  const files = new Map([
    ["Tiny-Q4_K_M.gguf", model],
    ["Tiny-Q8_0.gguf", noise],
    ["Tiny-F16-00001-of-00002.gguf", noise],
    ["Tiny-F16-00002-of-00002.gguf", noise],
  ]);
  const sha = (b) => createHash("sha256").update(b).digest("hex");
  const json = (res, status, v) => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(v));
  };
  const server = createServer((req, res) => {
    const u = new URL(req.url ?? "/", "http://x");
    const path = decodeURIComponent(u.pathname);
    if (path === "/api/models") {
      const q = (u.searchParams.get("search") ?? "").toLowerCase();
      const hits = REPO.toLowerCase().includes(q)
        ? [{ id: REPO, downloads: 1234, likes: 5, gated: false, lastModified: "2026-11-01T00:00:00.000Z", tags: ["gguf"] }]
        : [];
      return json(res, 200, hits);
    }
    if (path === `/api/models/${REPO}/tree/main`) {
      const entries = [{ type: "file", oid: "1", size: 40, path: "README.md" }];
      for (const [name, bytes] of files) {
        entries.push({ type: "file", oid: "2", size: 135, path: name, lfs: { oid: sha(bytes), size: bytes.length, pointerSize: 135 } });
      }
      return json(res, 200, entries);
    }
    const resolve = path.match(/^\/strata-test\/Tiny-GGUF\/resolve\/main\/(.+)$/);
    if (resolve) {
      if (!files.has(resolve[1])) return json(res, 404, { error: "Entry not found" });
      res.writeHead(302, { location: `/cdn/${encodeURIComponent(resolve[1])}` });
      return res.end();
    }
    const cdn = path.match(/^\/cdn\/(.+)$/);
    if (cdn && files.has(cdn[1])) {
      const bytes = files.get(cdn[1]);
      const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? "");
      const start = m ? Number(m[1]) : 0;
      const end = m && m[2] !== "" ? Math.min(Number(m[2]), bytes.length - 1) : bytes.length - 1;
      if (start >= bytes.length) {
        res.writeHead(416, { "content-range": `bytes */${bytes.length}` });
        return res.end();
      }
      const headers = { "content-length": String(end + 1 - start), "accept-ranges": "bytes" };
      if (m) headers["content-range"] = `bytes ${start}-${end}/${bytes.length}`;
      res.writeHead(m ? 206 : 200, headers);
      // A header read (a small range) goes at once; a download goes in pieces, slowly enough to be seen.
      if (end + 1 - start <= 8 * 1024 * 1024 && m && m[2] !== "") return res.end(bytes.subarray(start, end + 1));
      let at = start;
      const t = setInterval(() => {
        const stop = Math.min(at + chunkBytes, end + 1);
        res.write(bytes.subarray(at, stop));
        at = stop;
        if (at > end) {
          clearInterval(t);
          res.end();
        }
      }, chunkEveryMs);
      res.on("close", () => clearInterval(t));
      return;
    }
    json(res, 404, { error: "not found" });
  });
  return new Promise((ok) => {
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      ok({ server, url: `http://127.0.0.1:${port}` });
    });
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const file = process.argv[2];
  if (!file) {
    console.error("usage: node ui/e2e/mock-hub.mjs MODEL.gguf");
    process.exit(2);
  }
  const { url } = await startMockHub(file);
  console.log(`mock hub: ${url}`);
}
