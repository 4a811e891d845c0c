// Build and test configuration of the Strata web UI. `base: './'` keeps every asset path relative, so the
// same dist/ works inside the Tauri app and at `/` of `strata serve`. `npm run dev` proxies the API paths
// to a running server ($STRATA_URL, default http://127.0.0.1:8080), so the page talks to it as same-origin.
import { defineConfig } from "vitest/config";

const target = process.env.STRATA_URL ?? "http://127.0.0.1:8080";
const proxy = Object.fromEntries(["/v1", "/strata", "/health"].map((p) => [p, { target, changeOrigin: true }]));

export default defineConfig({
  base: "./",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", chunkSizeWarningLimit: 800 },
  server: { port: 5173, strictPort: true, proxy },
  test: {
    environment: "jsdom",
    globals: true,
    setupFiles: ["./test/setup.ts"],
    include: ["test/**/*.test.{ts,tsx}"],
  },
});
