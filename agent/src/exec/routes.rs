//! `POST /v1/exec` (one JSON response when the command ends) and `POST /v1/exec/stream` (NDJSON events
//! while it runs).

use crate::held_body::holding;
use std::convert::Infallible;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use orchard_api::agent::{ExecEvent, ExecResponse};
use tokio::sync::mpsc;

use super::output::{CapturedOutput, EventSink, OutputSink, StreamName, pump};
use super::request::{CommandRequest, IntoSpec, OutputEncoding, RequestKind};
use super::spawn::{Spawned, spawn};
use super::supervise::{DRAIN_GRACE, Finished, supervise};
use crate::error::{AgentError, json_response};
use crate::json_body::JsonBody;
use crate::state::AppState;

/// How long a streamed command's last output may take to reach a slow client after the command ended.
const STREAM_DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// Events buffered between the command and the client (backpressure beyond this).
const STREAM_EVENT_BUFFER: usize = 16;

pub async fn exec(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<CommandRequest>,
) -> Result<Response, AgentError> {
    let mut spec = request.into_spec(&state.config.root, RequestKind::Exec)?;
    state.apply_identity(&mut spec);
    let started = Instant::now();
    let encoding = spec.encoding;
    let running = match spawn(&spec, &state.config.scrubbed_env, &state.groups)? {
        Spawned::Running(running) => running,
        Spawned::Failed(failure) => {
            let stderr = match encoding {
                OutputEncoding::Text => format!("{}\n", failure.message),
                OutputEncoding::Base64 => {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("{}\n", failure.message))
                }
            };
            let response = ExecResponse {
                exit_code: Some(failure.exit_code),
                signal: None,
                timed_out: false,
                oom_killed: false,
                stdout: String::new(),
                stderr,
                stdout_truncated: false,
                stderr_truncated: false,
                stdout_lossy: false,
                stderr_lossy: false,
                duration_ms: started.elapsed().as_millis() as u64,
                output_encoding: encoding,
                error: Some(failure.message),
            };
            return Ok(json_response(StatusCode::OK, &response));
        }
    };
    let budget = &state.output_budget;
    let mut stdout = OutputSink::Buffer(CapturedOutput::with_budget(spec.max_output_bytes, budget));
    let mut stderr = OutputSink::Buffer(CapturedOutput::with_budget(spec.max_output_bytes, budget));
    let finished = supervise(
        running,
        spec.stdin.take(),
        &mut stdout,
        &mut stderr,
        spec.timeout,
        DRAIN_GRACE,
    )
    .await;
    let (OutputSink::Buffer(mut stdout), OutputSink::Buffer(mut stderr)) = (stdout, stderr) else {
        return Err(AgentError::Internal("output sinks changed kind".into()));
    };
    // The output stays charged to the agent-wide budget until the response carrying it is sent.
    let charges = (stdout.take_charge(), stderr.take_charge());
    let stdout = stdout.into_encoded(encoding);
    let stderr = stderr.into_encoded(encoding);
    let response = ExecResponse {
        exit_code: finished.exit_code,
        signal: finished.signal,
        timed_out: finished.timed_out,
        oom_killed: finished.oom_killed,
        stdout: stdout.data,
        stderr: stderr.data,
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        stdout_lossy: stdout.lossy,
        stderr_lossy: stderr.lossy,
        duration_ms: started.elapsed().as_millis() as u64,
        output_encoding: encoding,
        error: None,
    };
    // Released when the response body is dropped: after it was sent, or when the client went away.
    let (parts, body) = json_response(StatusCode::OK, &response).into_parts();
    Ok(Response::from_parts(parts, holding(body, charges)))
}

async fn send_event(events: &mpsc::Sender<Bytes>, event: &ExecEvent) {
    if let Ok(mut line) = serde_json::to_vec(event) {
        line.push(b'\n');
        let _ = events.send(Bytes::from(line)).await;
    }
}

pub async fn exec_stream(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<CommandRequest>,
) -> Result<Response, AgentError> {
    let mut spec = request.into_spec(&state.config.root, RequestKind::Exec)?;
    state.apply_identity(&mut spec);
    let started = Instant::now();
    let spawned = spawn(&spec, &state.config.scrubbed_env, &state.groups)?;
    let (events, mut receiver) = mpsc::channel::<Bytes>(STREAM_EVENT_BUFFER);
    let run = async move {
        let running = match spawned {
            Spawned::Running(running) => running,
            Spawned::Failed(failure) => {
                let message = format!("{}\n", failure.message);
                let mut stderr = OutputSink::Events(EventSink::new(
                    StreamName::Stderr,
                    spec.encoding,
                    spec.max_output_bytes,
                    events.clone(),
                ));
                pump(message.as_bytes(), &mut stderr).await;
                let exit = ExecEvent::Exit {
                    exit_code: Some(failure.exit_code),
                    signal: None,
                    timed_out: false,
                    oom_killed: false,
                    duration_ms: started.elapsed().as_millis() as u64,
                    stdout_truncated: false,
                    stderr_truncated: false,
                    stdout_lossy: false,
                    stderr_lossy: false,
                    error: Some(failure.message),
                };
                send_event(&events, &exit).await;
                return;
            }
        };
        send_event(&events, &ExecEvent::Started { pid: running.pid }).await;
        let mut stdout = OutputSink::Events(EventSink::new(
            StreamName::Stdout,
            spec.encoding,
            spec.max_output_bytes,
            events.clone(),
        ));
        let mut stderr = OutputSink::Events(EventSink::new(
            StreamName::Stderr,
            spec.encoding,
            spec.max_output_bytes,
            events.clone(),
        ));
        let supervised = supervise(
            running,
            spec.stdin.take(),
            &mut stdout,
            &mut stderr,
            spec.timeout,
            STREAM_DRAIN_GRACE,
        );
        let closed = events.closed();
        // A client that goes away closes the channel: dropping `supervised` then kills the group.
        let finished: Finished = tokio::select! {
            finished = supervised => finished,
            () = closed => return,
        };
        let (OutputSink::Events(mut stdout), OutputSink::Events(mut stderr)) = (stdout, stderr)
        else {
            return;
        };
        stdout.finish().await;
        stderr.finish().await;
        let exit = ExecEvent::Exit {
            exit_code: finished.exit_code,
            signal: finished.signal,
            timed_out: finished.timed_out,
            oom_killed: finished.oom_killed,
            duration_ms: started.elapsed().as_millis() as u64,
            stdout_truncated: stdout.truncated(),
            stderr_truncated: stderr.truncated(),
            stdout_lossy: stdout.lossy(),
            stderr_lossy: stderr.lossy(),
            error: None,
        };
        send_event(&events, &exit).await;
    };
    tokio::spawn(run);
    let stream = futures::stream::poll_fn(move |context| {
        receiver
            .poll_recv(context)
            .map(|event| event.map(Ok::<_, Infallible>))
    });
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}
