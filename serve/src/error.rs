//! OpenAI's error envelope: `{"error": {"message", "type", "param", "code"}}` with its status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error response.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming `param`.
    pub fn param(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.into()), ..ApiError::invalid(message) }
    }

    /// 400: a field we do not support yet.
    pub fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::param(param, format!("'{param}' {what} is not supported yet"))
        }
    }

    /// 400: a field no endpoint knows.
    pub fn unknown(param: &str) -> ApiError {
        ApiError {
            code: Some("unknown_parameter"),
            ..ApiError::param(param, format!("Unrecognized request argument supplied: {param}"))
        }
    }

    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model '{model}' does not exist"),
            )
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "Missing or invalid API key: send 'Authorization: Bearer KEY'",
            )
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("The request body is over the limit of {limit} bytes"),
            )
        }
    }

    pub fn saturated(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", format!("No route for {path}"))
    }

    /// The envelope's JSON.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
