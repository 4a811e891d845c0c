// The settings view: the engine's settings as a form, re-planned (debounced) as values change so the bars
// show what the load would take per device, and applied with save_settings in the desktop app. A browser
// cannot restart `strata serve`: there the settings are checked with POST /strata/plan and the flags to
// restart it with are shown. Errors are shown at the field they name. Speculative decoding has its own
// card: where drafts come from (off, n-gram lookup, a draft model and its devices) and how many. Requests
// at once (`--parallel`) multiply the KV: the bars count the number the plan says (the server's default
// when the field is empty). A remote
// endpoint's key is shown masked (RemoteKeyField); a typed key is never sent to be planned.
import { useEffect, useRef, useState } from "preact/hooks";
import type { PlanReply } from "../../bindings";
import {
  fieldOf,
  forPlanning,
  formFromSettings,
  KV_CHOICES,
  kvChoiceOf,
  settingsFromForm,
  type FieldErrors,
  type SettingsForm,
  type SpeculativeKind,
} from "../../settings/form";
import { TransportError, type Transport } from "../../transport/types";
import { messageOf } from "../../util/errors";
import { CheckField, Field, SelectField } from "./Field";
import { PlanBars } from "./PlanBars";
import { RemoteKeyField } from "./RemoteKeyField";

/**
 * The command line to restart `strata serve` with: PlanReply.flags leaves the model out, so it is added
 * from the settings when the flags do not name one.
 */
export function restartCommand(flags: readonly string[], modelPath: string | null): string {
  const named = flags.some((f) => f === "-m" || f === "--model" || f.startsWith("--model="));
  const model = !named && modelPath ? ["-m", modelPath] : [];
  return ["strata", "serve", ...model, ...flags].map(shellQuote).join(" ");
}

/** A command line argument quoted for a POSIX shell when it needs it. */
export function shellQuote(arg: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

/** What the plan's KV figures count, e.g. "KV for 4 requests at once". */
export function sequencesText(sequences: number): string {
  return `KV for ${sequences} ${sequences === 1 ? "request" : "requests"} at once`;
}

const SPECULATIVE_OPTIONS: readonly { value: SpeculativeKind; label: string }[] = [
  { value: "off", label: "Off" },
  { value: "ngram", label: "N-gram lookup (no second model)" },
  { value: "draft", label: "A draft model" },
];

export interface SettingsViewProps {
  transport: Transport;
  /** How long values must stay unchanged before they are planned. */
  planDelayMs?: number;
}

export function SettingsView({ transport, planDelayMs = 300 }: SettingsViewProps) {
  const apply = transport.caps.applySettings;
  const [form, setForm] = useState<SettingsForm | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [errors, setErrors] = useState<FieldErrors>({});
  const [formError, setFormError] = useState<string | null>(null);
  const [plan, setPlan] = useState<PlanReply | null>(null);
  const [planning, setPlanning] = useState(false);
  const [result, setResult] = useState<string | null>(null);
  const [flags, setFlags] = useState<string[] | null>(null);
  const [saving, setSaving] = useState(false);
  const seq = useRef(0);

  useEffect(() => {
    transport
      .getSettings()
      .then((s) => setForm(formFromSettings(s)))
      .catch((e: unknown) => setLoadError(messageOf(e)));
  }, [transport]);

  /** Shows an error of the backend at its field, or above the form when it names none. */
  const showError = (e: unknown) => {
    const err = TransportError.from(e);
    const field = err.code === "invalid" ? fieldOf(err.field) : null;
    if (field) {
      setErrors({ [field]: err.message });
      setFormError(null);
    } else {
      setFormError(err.message);
    }
  };

  // Re-plan once the values have stayed unchanged for planDelayMs.
  useEffect(() => {
    if (!form) return;
    const parsed = settingsFromForm(form);
    if (!parsed.ok) {
      setErrors(parsed.errors);
      return;
    }
    const mine = ++seq.current;
    const timer = setTimeout(() => {
      setPlanning(true);
      transport
        .plan(forPlanning(parsed.settings))
        .then((reply) => {
          if (mine !== seq.current) return;
          setPlan(reply);
          setErrors({});
          setFormError(null);
        })
        .catch((e: unknown) => {
          if (mine === seq.current) showError(e);
        })
        .finally(() => {
          if (mine === seq.current) setPlanning(false);
        });
    }, planDelayMs);
    return () => clearTimeout(timer);
  }, [form]);

  if (loadError) {
    return (
      <div class="settings">
        <p class="error" role="alert">
          Cannot read the settings: {loadError}
        </p>
      </div>
    );
  }
  if (!form) return <div class="settings muted">Reading the settings…</div>;

  const set = (patch: Partial<SettingsForm>) => {
    setForm({ ...form, ...patch });
    setResult(null);
    setFlags(null);
  };

  const applyInPlace = async () => {
    const parsed = settingsFromForm(form);
    if (!parsed.ok) {
      setErrors(parsed.errors);
      return;
    }
    setSaving(true);
    setResult(null);
    setFlags(null);
    try {
      const now = await transport.getSettings();
      const applied = await transport.applyInPlace!({ ...parsed.settings, model_path: now.model_path });
      seq.current++;
      setForm(formFromSettings(applied));
      setErrors({});
      setFormError(null);
      setResult("Applied: the server runs with these settings now, without a restart.");
    } catch (e) {
      showError(e);
    } finally {
      setSaving(false);
    }
  };

  const submit = async () => {
    const parsed = settingsFromForm(form);
    if (!parsed.ok) {
      setErrors(parsed.errors);
      return;
    }
    setSaving(true);
    setResult(null);
    setFlags(null);
    try {
      if (apply) {
        // The model is the Models view's to choose: this form was read when the app opened, so the model in
        // use now is read again (otherwise a model loaded since would be unloaded by this Apply).
        const now = await transport.getSettings();
        const saved = await transport.saveSettings({ ...parsed.settings, model_path: now.model_path });
        seq.current++; // a plan still on its way is for the old values
        setForm(formFromSettings(saved));
        setErrors({});
        setFormError(null);
        setResult("Saved. The engine restarts if its flags changed.");
      } else {
        const reply = await transport.plan(forPlanning(parsed.settings));
        setPlan(reply);
        setErrors({});
        setFormError(null);
        setFlags(reply.flags);
      }
    } catch (e) {
      showError(e);
    } finally {
      setSaving(false);
    }
  };

  const remote = form.engine_kind === "remote";
  const drafting = form.speculative_kind !== "off";
  const draftModel = form.speculative_kind === "draft";
  return (
    <form
      class="settings"
      noValidate
      onSubmit={(e) => {
        e.preventDefault();
        void submit();
      }}
    >
      {formError && (
        <p class="error" role="alert" data-testid="form-error">
          {formError}
        </p>
      )}
      <fieldset class="card">
        <legend>Devices and split</legend>
        <Field
          name="devices"
          label="Devices"
          value={form.devices}
          onInput={(v) => set({ devices: v })}
          error={errors.devices}
          hint='e.g. "cpu", "cuda:0,cuda:1" or "sim:200,sim:400"'
        />
        <Field
          name="layer_split"
          label="Layer split"
          value={form.layer_split}
          onInput={(v) => set({ layer_split: v })}
          error={errors.layer_split}
          hint='Layers on each device but the last, e.g. "15" or "10,20"; empty: automatic'
        />
        <Field
          name="vram_reserve_mib"
          label="VRAM reserve (MiB)"
          inputMode="numeric"
          value={form.vram_reserve_mib}
          onInput={(v) => set({ vram_reserve_mib: v })}
          error={errors.vram_reserve_mib}
        />
        <div class="plan-preview" aria-live="polite">
          {plan ? <PlanBars plan={plan.plan} /> : <p class="muted">{planning ? "Planning…" : "No plan yet."}</p>}
          {plan && typeof plan.plan.sequences === "number" && (
            <p class="hint" data-testid="plan-sequences">
              {sequencesText(plan.plan.sequences)}
            </p>
          )}
          {plan && !plan.plan.fits && plan.plan.problem && <p class="error">{plan.plan.problem}</p>}
        </div>
      </fieldset>
      <fieldset class="card">
        <legend>KV cache and context</legend>
        <div class="field">
          <label for="settings-kv">KV type</label>
          <select
            id="settings-kv"
            value={form.kv}
            aria-invalid={errors.kv ? "true" : "false"}
            aria-describedby={errors.kv ? "settings-kv-error" : undefined}
            onChange={(e) => set({ kv: kvChoiceOf((e.target as HTMLSelectElement).value) })}
          >
            {KV_CHOICES.map((c) => (
              <option key={c.value} value={c.value}>
                {c.label}
              </option>
            ))}
          </select>
          {errors.kv && (
            <p id="settings-kv-error" class="field-error" data-testid="error-kv">
              {errors.kv}
            </p>
          )}
        </div>
        <Field
          name="kv_resident"
          label="KV resident (tokens)"
          inputMode="numeric"
          value={form.kv_resident}
          onInput={(v) => set({ kv_resident: v })}
          error={errors.kv_resident}
          hint="Tokens of KV kept on the device; older ones move to the host. Empty: all."
        />
        <Field
          name="experts"
          label="Experts"
          value={form.experts}
          onInput={(v) => set({ experts: v })}
          error={errors.experts}
          hint="A mixture of experts: auto, cpu (host RAM; attention stays on the GPU), gpu, or cpu:0..12."
        />
        <Field
          name="max_context"
          label="Max context (tokens)"
          inputMode="numeric"
          value={form.max_context}
          onInput={(v) => set({ max_context: v })}
          error={errors.max_context}
          hint="Empty: the model's trained context."
        />
      </fieldset>
      <fieldset class="card">
        <legend>Requests, conversation cache and threads</legend>
        <Field
          name="parallel"
          label="Requests at once"
          inputMode="numeric"
          value={form.parallel}
          onInput={(v) => set({ parallel: v })}
          error={errors.parallel}
          hint="Each with its own KV, 1 to 256 (1 with speculative decoding). Empty: the server's default (up to 4 on the CPU, 1 on a GPU)."
        />
        <Field
          name="cache_slots"
          label="Cache slots"
          inputMode="numeric"
          value={form.cache_slots}
          onInput={(v) => set({ cache_slots: v })}
          error={errors.cache_slots}
        />
        <Field
          name="cache_mib"
          label="Cache budget (MiB)"
          inputMode="numeric"
          value={form.cache_mib}
          onInput={(v) => set({ cache_mib: v })}
          error={errors.cache_mib}
        />
        <Field
          name="threads"
          label="Threads"
          inputMode="numeric"
          value={form.threads}
          onInput={(v) => set({ threads: v })}
          error={errors.threads}
          hint="Empty: one per core."
        />
      </fieldset>
      <fieldset class="card">
        <legend>Speculative decoding</legend>
        <SelectField
          name="speculative_kind"
          label="Drafts from"
          value={form.speculative_kind}
          options={SPECULATIVE_OPTIONS}
          onChange={(v) => set({ speculative_kind: v })}
          error={errors.speculative_kind}
        />
        {drafting && (
          <Field
            name="draft_max"
            label="Most drafts"
            inputMode="numeric"
            value={form.draft_max}
            onInput={(v) => set({ draft_max: v })}
            error={errors.draft_max}
            hint="Per verification, 1 to 256."
          />
        )}
        {drafting && (
          <Field
            name="draft_min"
            label="Fewest drafts"
            inputMode="numeric"
            value={form.draft_min}
            onInput={(v) => set({ draft_min: v })}
            error={errors.draft_min}
            hint="Fewer are not verified."
          />
        )}
        {draftModel && (
          <Field
            name="draft_model_path"
            label="Draft model (GGUF file)"
            wide
            value={form.draft_model_path}
            onInput={(v) => set({ draft_model_path: v })}
            error={errors.draft_model_path}
            placeholder="/models/small-model.gguf"
            hint="A smaller model with the same vocabulary."
          />
        )}
        {draftModel && (
          <Field
            name="draft_devices"
            label="Draft devices"
            value={form.draft_devices}
            onInput={(v) => set({ draft_devices: v })}
            error={errors.draft_devices}
            hint='Numbers of devices above, e.g. "1" or "0,1"; empty: the first'
          />
        )}
      </fieldset>
      <fieldset class="card" aria-describedby={errors.engine ? "settings-engine-error" : undefined}>
        <legend>Engine</legend>
        <div class="radio-row" role="radiogroup" aria-label="Engine location">
          <label>
            <input
              type="radio"
              name="engine_kind"
              value="local"
              checked={!remote}
              onChange={() => set({ engine_kind: "local" })}
            />
            Local (Strata)
          </label>
          <label>
            <input
              type="radio"
              name="engine_kind"
              value="remote"
              checked={remote}
              onChange={() => set({ engine_kind: "remote" })}
            />
            Remote OpenAI-compatible endpoint
          </label>
        </div>
        {errors.engine && (
          <p id="settings-engine-error" class="field-error" data-testid="error-engine">
            {errors.engine}
          </p>
        )}
        {remote && (
          <>
            <Field
              name="engine_url"
              label="URL"
              type="url"
              value={form.engine_url}
              onInput={(v) => set({ engine_url: v })}
              error={errors.engine_url}
              placeholder="https://gpu-box:8000/v1"
              hint="https://, or http:// to this machine (127.0.0.1, localhost)"
            />
            <CheckField
              name="engine_allow_insecure"
              label="Allow insecure (http)"
              checked={form.engine_allow_insecure}
              onChange={(v) => set({ engine_allow_insecure: v })}
              error={errors.engine_allow_insecure}
              hint="Sends the key and the chats unencrypted to another machine."
            />
            <RemoteKeyField form={form} set={set} errors={errors} />
            <Field
              name="engine_model"
              label="Model name"
              value={form.engine_model}
              onInput={(v) => set({ engine_model: v })}
              error={errors.engine_model}
            />
          </>
        )}
      </fieldset>
      <div class="button-row">
        <button type="submit" class="primary" disabled={saving}>
          {apply ? "Apply" : "Check"}
        </button>
        {!apply && transport.applyInPlace && (
          <button type="button" disabled={saving} onClick={() => void applyInPlace()} data-testid="apply-in-place">
            Apply without a restart
          </button>
        )}
        {result && (
          <span class="ok" role="status">
            {result}
          </span>
        )}
      </div>
      {!apply && (
        <p class="note">
          A browser cannot restart <code>strata serve</code>: Check validates these settings and shows the flags to
          restart it with.{" "}
          {transport.applyInPlace && (
            <>
              Apply without a restart changes them in the running server (the model reloads beside the one serving);
              the devices, the VRAM reserve and speculative decoding need a restart.
            </>
          )}
        </p>
      )}
      {flags && (
        <div class="restart" role="status" data-testid="restart-flags">
          <p>restart strata serve with:</p>
          <pre>
            <code>{restartCommand(flags, form.model_path)}</code>
          </pre>
          <p class="hint">Keep the server's own flags too (--host, --port, --api-key, ...).</p>
        </div>
      )}
    </form>
  );
}
