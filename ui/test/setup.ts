// Test setup: uPlot replaced by FakeUPlot (jsdom has no canvas), DOM cleanup and a clean localStorage and
// sessionStorage after each test.
import { cleanup } from "@testing-library/preact";
import { afterEach, vi } from "vitest";

vi.mock("uplot", async () => {
  const m = await import("./fakeUplot");
  return { default: m.FakeUPlot };
});

afterEach(() => {
  cleanup();
  localStorage.clear();
  sessionStorage.clear();
});
