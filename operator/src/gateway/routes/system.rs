//! Unauthenticated routes: `/healthz` (the gateway answers) and `/openapi.json`.

/// The gateway answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "system",
    security(()),
    responses((status = 200, description = "`ok`", body = String))
)]
pub async fn healthz() -> &'static str {
    "ok\n"
}
