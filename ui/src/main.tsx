// The entry point: picks the transport (Tauri inside the desktop app, else HTTP to the page's origin),
// wires the API key form to the HTTP one, and renders the app.
import "./locale";
import { render } from "preact";
import { App } from "./app";
import { createTransport } from "./transport/index";
import { KeyRequests } from "./views/keyRequests";
import "./styles/base.css";
import "./styles/chat.css";
import "./styles/forms.css";
import "./styles/devices.css";
import "./styles/library.css";

const keys = new KeyRequests();
const transport = createTransport(keys.ask);
const root = document.getElementById("app");
if (root) render(<App transport={transport} keys={transport.kind === "http" ? keys : undefined} />, root);
