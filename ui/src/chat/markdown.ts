// Model output as safe HTML: Markdown (marked, GitHub flavour) with code blocks highlighted (highlight.js
// core and a few languages), then sanitized by DOMPurify with an allow-list. Model output must never run
// script or reach the Tauri API, so: raw HTML in the text is shown as text, not parsed; no script, style,
// form, image or frame element survives; no event handler attribute; links lose their href (kept in
// data-href and the title for the reader) so that clicking one opens nothing inside the app; images are
// shown as their alt text, since the app makes no network fetches.
import createDOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import typescript from "highlight.js/lib/languages/typescript";
import { Marked, type Tokens } from "marked";

hljs.registerLanguage("bash", bash);
hljs.registerLanguage("c", c);
hljs.registerLanguage("cpp", cpp);
hljs.registerLanguage("javascript", javascript);
hljs.registerLanguage("json", json);
hljs.registerLanguage("python", python);
hljs.registerLanguage("rust", rust);
hljs.registerLanguage("typescript", typescript);

const ALLOWED_TAGS = [
  "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code", "pre",
  "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "span", "div", "sup",
  "sub", "kbd",
];
const ALLOWED_ATTR = ["class", "title", "align", "start", "colspan", "rowspan"];
/** Schemes a link's address may keep in data-href (for display only: nothing navigates). */
const SHOWN_SCHEMES = /^(https?:|mailto:)/i;

export function escapeHtml(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

/** A code block: highlighted when its language is known, escaped otherwise. */
export function highlightCode(code: string, lang: string | undefined): string {
  const name = (lang ?? "").trim().split(/\s+/)[0]?.toLowerCase() ?? "";
  const safeName = name.replace(/[^a-z0-9+#_-]/g, "");
  if (safeName && hljs.getLanguage(safeName)) {
    const html = hljs.highlight(code, { language: safeName, ignoreIllegals: true }).value;
    return `<pre><code class="hljs language-${safeName}">${html}</code></pre>`;
  }
  return `<pre><code class="hljs">${escapeHtml(code)}</code></pre>`;
}

// breaks: a single newline is a line break, as models write them.
const marked = new Marked({ gfm: true, breaks: true, async: false });
marked.use({
  renderer: {
    code({ text, lang }: Tokens.Code): string {
      return highlightCode(text, lang) + "\n";
    },
    html({ text }: Tokens.HTML | Tokens.Tag): string {
      return escapeHtml(text);
    },
    image({ text, href }: Tokens.Image): string {
      return escapeHtml(`[image: ${text || href}]`);
    },
  },
});

let purifier: ReturnType<typeof createDOMPurify> | null = null;

function purify(): ReturnType<typeof createDOMPurify> {
  if (purifier) return purifier;
  const p = createDOMPurify(window);
  p.addHook("afterSanitizeAttributes", (node) => {
    if (node.nodeName !== "A") return;
    const el = node as Element;
    const href = el.getAttribute("href");
    el.removeAttribute("href");
    el.removeAttribute("target");
    el.classList.add("md-link");
    if (href && SHOWN_SCHEMES.test(href.trim())) {
      el.setAttribute("data-href", href.trim());
      el.setAttribute("title", href.trim());
    }
  });
  purifier = p;
  return p;
}

/** Sanitizes HTML with the allow-list above (links made inert). */
export function sanitizeHtml(html: string): string {
  return purify().sanitize(html, {
    ALLOWED_TAGS,
    ALLOWED_ATTR: [...ALLOWED_ATTR, "href"],
    ALLOW_DATA_ATTR: false,
    ALLOW_ARIA_ATTR: false,
    KEEP_CONTENT: true,
    RETURN_TRUSTED_TYPE: false,
  }) as string;
}

/** Markdown text (a whole reply, or the part streamed so far) as sanitized HTML. */
export function renderMarkdown(text: string): string {
  const html = marked.parse(text, { async: false });
  return sanitizeHtml(html);
}
