//! A tenant's turns, and what its tools answered: for tests that look at a workspace the way
//! its agents see it (a session made from an upload has its files where only its views reach).

use anyhow::Context;
use forkd_proto::v1 as pb;

use crate::Caller;

impl Caller {
    /// Sends `text` to the session and waits for its turn to end: the turn's final text.
    pub async fn turn(&mut self, session_id: &str, text: &str) -> anyhow::Result<String> {
        let request = self.req(pb::SendMessageRequest {
            session_id: session_id.to_owned(),
            text: text.into(),
            ..Default::default()
        });
        let mut stream = self.client.send_message(request).await?.into_inner();
        let mut events = Vec::new();
        while let Some(event) = stream.message().await? {
            events.extend(event.event);
        }
        crate::turn_text(&events)
            .map(str::to_owned)
            .context("the turn did not end")
    }

    /// The text of every tool result in the session's own transcript, in order, and whether
    /// each was an error.
    pub async fn tool_results(&mut self, session_id: &str) -> anyhow::Result<Vec<(String, bool)>> {
        let request = self.req(pb::ListAgentsRequest {
            session_id: session_id.to_owned(),
            include_ended: true,
            ..Default::default()
        });
        let agents = self.client.list_agents(request).await?.into_inner().agents;
        let parent = agents
            .into_iter()
            .find(|a| a.kind == "parent")
            .context("the session has no main loop yet")?;
        let request = self.req(pb::GetTranscriptRequest {
            agent_id: parent.agent_id,
            include_shared_prefix: true,
        });
        let messages = self
            .client
            .get_transcript(request)
            .await?
            .into_inner()
            .messages;
        let mut results = Vec::new();
        for message in messages {
            let blocks: Vec<serde_json::Value> = serde_json::from_str(&message.content_json)?;
            for block in blocks.iter().filter(|b| b["type"] == "tool_result") {
                let text = match &block["content"] {
                    serde_json::Value::String(text) => text.clone(),
                    parts => parts
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                };
                results.push((text, block["is_error"].as_bool().unwrap_or(false)));
            }
        }
        Ok(results)
    }

    /// Runs `command` with the session's `Bash` tool (a turn of the sim's) and returns what the
    /// tool answered.
    pub async fn bash(&mut self, session_id: &str, command: &str) -> anyhow::Result<String> {
        let input = serde_json::json!({ "command": command });
        self.turn(
            session_id,
            &format!("Run it.\n@sim tool Bash {input}\n@sim say ran"),
        )
        .await?;
        let results = self.tool_results(session_id).await?;
        let (text, _) = results.last().context("the turn called no tool")?;
        Ok(text.clone())
    }
}
