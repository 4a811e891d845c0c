import { describe, expect, it } from "vitest";
import { usableLanguage } from "../src/locale";

describe("locale", () => {
  it("replaces a tag Intl rejects (the C locale of WebKitGTK under LANG=C.UTF-8) and keeps real ones", () => {
    expect(() => new Intl.NumberFormat("C")).toThrow();
    expect(usableLanguage("C")).toBe("en-US");
    expect(usableLanguage("")).toBe("en-US");
    expect(usableLanguage(undefined)).toBe("en-US");
    expect(usableLanguage("de-DE")).toBe("de-DE");
    expect(() => new Intl.NumberFormat(usableLanguage("C"))).not.toThrow();
  });
});
