// opencode-tui attribution plugin: tags each model call with the assistant message it belongs to.
//
// OpenCode's `chat.headers` hook receives the session id, the agent, the model and the *parent user
// message*, not the assistant message id. So we follow `message.updated` events, keep the assistant
// messages that are still in progress, and add `X-OpenCode-Assistant-Message-Id` only when exactly
// one active assistant message matches (session, parent, agent, model, provider). None or several
// matching: no header — the proxy then leaves the call unattributed instead of guessing.
// A retried call for the same message still matches the same message, so retries keep the id.

const HEADER = "X-OpenCode-Assistant-Message-Id"

export const OpencodeTuiAttribution = async () => {
  const active = new Map() // message id -> { sessionID, parentID, agent, modelID, providerID }

  const agentOf = (info) => info.agent ?? info.mode
  const done = (info) => Boolean(info.time && info.time.completed) || info.error != null

  return {
    event: async ({ event }) => {
      if (!event || !event.properties) return
      if (event.type === "message.updated") {
        const info = event.properties.info
        if (!info || info.role !== "assistant") return
        if (done(info)) {
          active.delete(info.id)
          return
        }
        active.set(info.id, {
          sessionID: info.sessionID,
          parentID: info.parentID,
          agent: agentOf(info),
          modelID: info.modelID,
          providerID: info.providerID,
        })
      } else if (event.type === "message.removed") {
        active.delete(event.properties.messageID)
      } else if (event.type === "session.deleted" || event.type === "session.idle") {
        const sid = event.properties.sessionID ?? (event.properties.info && event.properties.info.id)
        for (const [id, m] of active) if (m.sessionID === sid) active.delete(id)
      }
    },
    "chat.headers": async (input, output) => {
      const parentID = input.message && input.message.id
      const modelID = input.model && input.model.id
      const providerID = input.model && input.model.providerID
      const matches = []
      for (const [id, m] of active) {
        if (
          m.sessionID === input.sessionID &&
          m.parentID === parentID &&
          m.agent === input.agent &&
          m.modelID === modelID &&
          m.providerID === providerID
        ) {
          matches.push(id)
        }
      }
      if (matches.length === 1) output.headers[HEADER] = matches[0]
    },
  }
}
