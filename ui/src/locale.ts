// Runs before anything else (main.tsx imports it first): a webview started under the C or POSIX locale
// (WebKitGTK with LANG=C.UTF-8, Debian's and most containers' default) reports navigator.language "C",
// which Intl rejects ("invalid language tag") and which uPlot passes to Intl.NumberFormat when its module
// loads, leaving a blank window. Such a tag is replaced by "en-US".
export function usableLanguage(tag: string | undefined): string {
  if (!tag) return "en-US";
  try {
    return Intl.getCanonicalLocales(tag)[0] ?? "en-US";
  } catch {
    return "en-US";
  }
}

const reported = typeof navigator === "undefined" ? undefined : navigator.language;
if (typeof navigator !== "undefined" && usableLanguage(reported) !== reported) {
  const fixed = usableLanguage(reported);
  Object.defineProperty(navigator, "language", { configurable: true, get: () => fixed });
  Object.defineProperty(navigator, "languages", { configurable: true, get: () => [fixed] });
}
