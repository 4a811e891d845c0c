// Model output rendered as Markdown never yields script, handlers, javascript: URLs or navigable links.
import { describe, expect, it } from "vitest";
import { renderMarkdown } from "../src/chat/markdown";

function dom(html: string): HTMLElement {
  const div = document.createElement("div");
  div.innerHTML = html;
  return div;
}

function assertInert(root: HTMLElement): void {
  expect(root.querySelector("script, iframe, object, embed, img, style, form, svg")).toBeNull();
  for (const el of root.querySelectorAll("*")) {
    for (const a of el.attributes) {
      expect(a.name.startsWith("on"), `${el.tagName} has ${a.name}`).toBe(false);
      expect(a.value.toLowerCase().replace(/\s/g, "")).not.toContain("javascript:");
    }
  }
  expect(root.querySelector("a[href]")).toBeNull();
}

describe("renderMarkdown", () => {
  it("renders Markdown with highlighted code", () => {
    const root = dom(renderMarkdown("# Title\n\nSome **bold**.\n\n```rust\nfn main() { let x = 1; }\n```\n"));
    expect(root.querySelector("h1")?.textContent).toBe("Title");
    expect(root.querySelector("strong")?.textContent).toBe("bold");
    const code = root.querySelector("pre code.language-rust");
    expect(code).not.toBeNull();
    expect(code?.querySelector(".hljs-keyword")?.textContent).toBe("fn");
  });

  it("shows raw HTML as text and runs nothing", () => {
    const text = 'Hi <img src=x onerror=alert(1)> and <script>alert(2)</script> <a href="javascript:alert(3)">x</a>';
    const root = dom(renderMarkdown(text));
    assertInert(root);
    expect(root.textContent).toContain("<img src=x onerror=alert(1)>");
    expect(root.textContent).toContain("<script>alert(2)</script>");
  });

  it("makes Markdown links inert and drops javascript: addresses", () => {
    const root = dom(renderMarkdown("[safe](https://example.com/a) [bad](javascript:alert(1)) <https://auto.example>"));
    assertInert(root);
    const links = [...root.querySelectorAll("a")];
    expect(links.map((a) => a.getAttribute("data-href"))).toEqual(["https://example.com/a", null, "https://auto.example"]);
  });

  it("shows an image as its alt text without fetching it", () => {
    const root = dom(renderMarkdown("![a cat](http://example.com/cat.png)"));
    assertInert(root);
    expect(root.textContent).toContain("[image: a cat]");
  });

  it("sanitizes even HTML that slips through as a code language", () => {
    const root = dom(renderMarkdown('```"><img src=x onerror=alert(1)>\ncode\n```'));
    assertInert(root);
  });
});
